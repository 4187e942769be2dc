package org.sirapipeline.analysis;

import org.apache.lucene.analysis.TokenStream;
import org.apache.lucene.analysis.en.PorterStemFilter;
import org.elasticsearch.plugin.NamedComponent;
import org.elasticsearch.plugin.analysis.TokenFilterFactory;

/** Lucene's Porter stemmer (the "english" stemmer of the analysis-common module). */
@NamedComponent("sira_porter_stem")
public class PorterStemFactory implements TokenFilterFactory {
    @Override
    public TokenStream create(TokenStream input) {
        return new PorterStemFilter(input);
    }
}
