package org.sirapipeline.analysis;

import org.apache.lucene.analysis.TokenStream;
import org.apache.lucene.analysis.en.EnglishPossessiveFilter;
import org.elasticsearch.plugin.NamedComponent;
import org.elasticsearch.plugin.analysis.TokenFilterFactory;

/** Removes a trailing 's, as the "possessive_english" stemmer of analysis-common does. */
@NamedComponent("sira_english_possessive")
public class EnglishPossessiveFactory implements TokenFilterFactory {
    @Override
    public TokenStream create(TokenStream input) {
        return new EnglishPossessiveFilter(input);
    }
}
