"""The ``sira`` command line."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import shutil
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from pipeline import batchfiles, enrich, local, policies
from pipeline.config import DfBasis, EngineKind, Settings, Stance, redact_url
from pipeline.engine import Engine, EngineUnavailable, describe_error, resent_line
from pipeline.jobs import (
    IndexSummary,
    JobFailed,
    JobSummary,
    index_as_is,
    index_corpus,
    merge_line,
    reindex,
)
from pipeline.llm import ModelClient, NotConfigured
from pipeline.loaders import CorpusError, beir_split, count_items, load_queries
from pipeline.local import servers
from pipeline.policies import PolicyKind
from pipeline.profile import DEFAULT_W, Classes, Profile, ProfileError
from pipeline.profile import META_KEY as PROFILE_META
from pipeline.profile import read_file as read_profile
from pipeline.profile import write_file as write_profile
from pipeline.query import SearchResult, install_template, search, template_params
from pipeline.schema import OWN, Layout


class _App(typer.Typer):
    """Typer, with every command ending on an engine error (unreachable, credentials
    refused, no such index, a refused request) with one line naming it, not a traceback."""

    def command(self, *args: Any, **kwargs: Any) -> Callable[[Callable], Callable]:
        register = super().command(*args, **kwargs)

        def decorator(func: Callable) -> Callable:
            @functools.wraps(func)
            def one_line_errors(*a: Any, **k: Any) -> Any:
                try:
                    return func(*a, **k)
                except (typer.Exit, typer.Abort):
                    raise
                except Exception as exc:
                    message = describe_error(exc, _CONNECTED.get("url"))
                    if message is None:
                        raise
                    err.print(f"error: {message}")
                    raise typer.Exit(2) from exc

            register(one_line_errors)
            return func

        return decorator


_CONNECTED: dict[str, str] = {}  # the engine URL the command connected to, for messages
_ENGINES: list[Engine] = []  # the engines the command connected to: their resends are said
app = _App(help="SIRA: LLM-enriched lexical retrieval for Elasticsearch and OpenSearch.",
           no_args_is_help=True, pretty_exceptions_show_locals=False)
engine_app = _App(help="Local search engines for development and tests.",
                         no_args_is_help=True)
app.add_typer(engine_app, name="engine")
profile_app = _App(help="The search profile stored with an index (w, max_n, classes, "
                   "sketch budget, filter policy).", no_args_is_help=True)
app.add_typer(profile_app, name="profile")
template_app = _App(help="The stored search template.", no_args_is_help=True)
app.add_typer(template_app, name="template")
cache_app = _App(help="The proposal cache (one entry per text, prompt version and model).",
                 no_args_is_help=True)
app.add_typer(cache_app, name="cache")

out = Console(soft_wrap=True, markup=False)  # printed text comes from data: no markup
err = Console(stderr=True, soft_wrap=True, markup=False)
LOCAL = "local"


IndexOpt = Annotated[str | None, typer.Option("--index", help="Index name (else the global "
                                              "--index, else SIRA_INDEX__NAME).")]


def _with(settings: Settings, **sections: dict) -> Settings:
    """New settings with some values of some sections replaced. Settings are resolved here,
    at the edge, and the steps get them whole: nothing changes them afterwards."""
    return settings.model_copy(update={
        name: getattr(settings, name).model_copy(update=values)
        for name, values in sections.items()})


def _settings(ctx: typer.Context, index: str | None = None) -> Settings:
    """The settings built by the main callback, with a command's own --index applied."""
    settings: Settings = ctx.obj
    if index:
        settings = _with(settings, index={"name": index})
    return settings


@app.callback()
def main(
    ctx: typer.Context,
    engine_url: Annotated[str | None, typer.Option(help="Engine URL (else SIRA_ENGINE__URL, "
                                                   "else the local engine).")] = None,
    engine_kind: Annotated[EngineKind | None, typer.Option(help="opensearch or elasticsearch")]
    = None,
    index: Annotated[str | None, typer.Option(help="Index name (SIRA_INDEX__NAME).")] = None,
    state_dir: Annotated[Path | None, typer.Option(help="Where local engines are recorded.")]
    = None,
) -> None:
    settings = Settings()
    engine_update = {k: v for k, v in {"url": engine_url, "kind": engine_kind}.items() if v}
    if engine_update:
        settings = _with(settings, engine=engine_update)
    if index:
        settings = _with(settings, index={"name": index})
    if state_dir:
        settings = settings.model_copy(update={"state_dir": state_dir})
    ctx.obj = settings
    ctx.call_on_close(_print_resent)  # when the command ends, whether it succeeded or not


def _connect(settings: Settings) -> Engine:
    try:
        engine = local.connect(settings, local_name=LOCAL)
        _CONNECTED["url"] = engine.url
    except EngineUnavailable as exc:
        err.print(f"error: {exc}")
        raise typer.Exit(2) from exc
    _ENGINES.append(engine)
    return engine


def _print_resent() -> None:
    """What the engine's pressure cost the command, though nothing was lost by it."""
    resent = sum((engine.resent for engine in _ENGINES), Counter())
    _ENGINES.clear()
    if resent:
        err.print(f"requests sent again when the engine was busy or slow: {resent_line(resent)}")


def _fail(message: str, code: int = 2) -> typer.Exit:
    err.print(f"error: {message}")
    return typer.Exit(code)


@contextlib.contextmanager
def _on_sigterm(handler: Callable[[int, object], None]) -> Iterator[None]:
    """``handler`` for SIGTERM (a pod deleted, a kill) while the command runs; the handler
    the process had before, after it: the process may go on (tests, a caller)."""
    before = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


# -- sira engine ---------------------------------------------------------------------------


@engine_app.command("fetch")
def engine_fetch(
    ctx: typer.Context,
    kind: Annotated[EngineKind, typer.Option(help="opensearch or elasticsearch")] = "opensearch",
    version: Annotated[str | None, typer.Option(help="Artifact version.")] = None,
) -> None:
    """Download an engine from Maven Central into the Maven repository (no start)."""
    err.print(f"fetching {kind} {version or servers.DEFAULT_VERSIONS[kind]} from Maven Central "
              "(the first time up to about 200 MB into ~/.m2; cached after)...")
    try:
        servers.fetch(kind, version, _settings(ctx).state_dir)
    except servers.EngineError as exc:
        raise _fail(str(exc)) from exc
    out.print(f"{kind} {version or servers.DEFAULT_VERSIONS[kind]} is fetched")


@engine_app.command("start")
def engine_start(
    ctx: typer.Context,
    kind: Annotated[EngineKind, typer.Option(help="opensearch or elasticsearch")] = "opensearch",
    name: Annotated[str, typer.Option(help="Name to record it under.")] = LOCAL,
    port: Annotated[int | None, typer.Option(help="HTTP port (default: a free one).")] = None,
    nodes: Annotated[int, typer.Option(help="Number of nodes (OpenSearch).")] = 1,
    heap_mb: Annotated[int | None, typer.Option(help="JVM heap in MiB.")] = None,
    version: Annotated[str | None, typer.Option(help="Artifact version.")] = None,
    security: Annotated[bool, typer.Option(help="Elasticsearch: basic auth on.")] = False,
) -> None:
    """Start a local engine on 127.0.0.1 (or find it running) and wait until it is healthy."""
    try:
        record = servers.start(kind, name, _settings(ctx).state_dir, port=port, nodes=nodes,
                               heap_mb=heap_mb, version=version, security=security)
    except servers.EngineError as exc:
        raise _fail(str(exc)) from exc
    out.print(f"{record.kind} {record.version} '{record.name}' is up at {record.url} "
              f"({record.nodes} node(s)); log: {record.log_file}")


@engine_app.command("stop")
def engine_stop(ctx: typer.Context, name: Annotated[str, typer.Option()] = LOCAL) -> None:
    """Stop a local engine."""
    stopped = servers.stop(_settings(ctx).state_dir, name)
    out.print(f"'{name}' stopped" if stopped else f"'{name}' was not running")


@engine_app.command("status")
def engine_status(ctx: typer.Context, name: Annotated[str, typer.Option()] = LOCAL) -> None:
    """Show how to reach a local engine (never its password)."""
    info = servers.status(_settings(ctx).state_dir, name)
    out.print_json(json.dumps(info))
    if not info["running"]:
        raise typer.Exit(1)


# -- sira index / search -------------------------------------------------------------------


def _print_problems(summary: IndexSummary, limit: int = 20) -> None:
    problems = [str(p) for p in summary.load.problems]
    problems += [str(f) for f in summary.bulk.failures]
    for line in problems[:limit]:
        err.print("skipped " + line, highlight=False)
    if len(problems) > limit:
        err.print(f"... and {len(problems) - limit} more")


class _Bars:
    """Progress bars on stderr, gone when the step is done."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress

    def bar(self, label: str, total: int | None = None) -> Callable[..., None]:
        """A bar of ``total`` items; call it with how many were done (default one)."""
        task = self.progress.add_task(label, total=total)
        return lambda n=1: self.progress.advance(task, n)

    def counter(self, label: str) -> Callable[[int, int], None]:
        """A bar whose total is learnt as it goes; call it with (done, total)."""
        task = self.progress.add_task(label, total=None)
        return lambda done, total: self.progress.update(task, completed=done, total=total)


@contextlib.contextmanager
def _progress() -> Iterator[_Bars]:
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err, transient=True) as progress:
        yield _Bars(progress)


def _index(settings: Settings, engine: Engine, path: Path, recreate: bool) -> IndexSummary:
    total = count_items(path)
    with _progress() as bars:
        summary = index_corpus(engine, settings, path, recreate=recreate,
                               on_doc=bars.bar("indexing", total))
    _print_problems(summary)
    out.print(f"{settings.index.name}: {summary.line()}")
    return summary


@app.command("index")
def index_cmd(
    ctx: typer.Context,
    path: Annotated[Path, typer.Argument(help="JSONL file, BEIR folder or Markdown folder.")],
    recreate: Annotated[bool, typer.Option(help="Drop the index first.")] = False,
    shards: Annotated[int | None, typer.Option(help="Primary shards of a new index.")] = None,
    strict: Annotated[bool, typer.Option(help="Exit 1 if any input was skipped.")] = False,
    fields: Annotated[str | None, typer.Option(
        help="Keep every field of every JSON line as it is, in an index of your shape, "
             "attached with these comma-separated text fields (the model reads them).")]
    = None,
    mapping: Annotated[Path | None, typer.Option(
        help="With --fields: the new index's mapping (or {settings, mappings}); default: "
             "the engine's dynamic mapping.")] = None,
    index: IndexOpt = None,
) -> None:
    """Load a corpus into the index (created from mappings/ if missing; with --fields, in
    your own shape, every field kept)."""
    settings = _settings(ctx, index)
    if shards:
        settings = _with(settings, index={"shards": shards})
    if mapping and not fields:
        raise _fail("--mapping goes with --fields (the text fields the model reads)")
    engine = _connect(settings)
    try:
        if fields:
            if recreate:
                engine.delete_index(settings.index.name)
            with _progress() as bars:
                summary = index_as_is(engine, settings, path,
                                      [f.strip() for f in fields.split(",")],
                                      mapping_file=mapping,
                                      on_doc=bars.bar("indexing", count_items(path)))
            _print_problems(summary)
            out.print(f"{settings.index.name}: {summary.line()}")
        else:
            summary = _index(settings, engine, path, recreate)
    except CorpusError as exc:
        raise _fail(str(exc)) from exc
    if summary.load.loaded == 0:
        raise _fail(f"{path}: no document could be loaded", 1)
    if summary.bulk.failed or (strict and summary.load.skipped):
        raise typer.Exit(1)


SketchBudgetOpt = Annotated[int | None, typer.Option(
    min=1, help="At most this many distinct sketch terms take part (whole phrases, in the "
                "sketch's order): less engine time, some quality (README, Speed).")]


def _print_hits(result: SearchResult, explain: bool = False) -> None:
    if result.sketch is not None or result.expansion_note:
        out.print(f"sketch: {result.sketch}", highlight=False)
        out.print(f"expansion: {result.expansion} (DF cap {result.cap})", highlight=False)
        for dropped in result.dropped:
            out.print(f"  dropped {dropped.term!r}: {dropped.reason}", highlight=False)
        if result.expansion_note:
            out.print(f"  {result.expansion_note}", highlight=False)
    title = f"{result.query!r}: {result.total} hits, {result.took_ms} ms"
    if result.also:
        title += f", fused with {len(result.also)} more phrasing(s)"
    table = Table(title=title, title_justify="left")
    for column in ("rank", "id", "score", "title"):
        table.add_column(column, overflow="fold")
    for rank, hit in enumerate(result.hits, start=1):
        table.add_row(str(rank), hit.id, f"{hit.score:.3f}", (hit.title or hit.text)[:80])
    out.print(table)
    if explain:
        out.print("profile: " + Profile.model_validate(result.profile).describe(),
                  highlight=False)
        for rank, hit in enumerate(result.hits, start=1):
            matched = "; ".join(f"{f}: {', '.join(t)}" for f, t in hit.matched_terms.items())
            out.print(f"{rank}. {hit.id} [{', '.join(hit.matched_queries)}] {matched}",
                      highlight=False, markup=False)


@app.command("search")
def search_cmd(
    ctx: typer.Context,
    text: Annotated[str, typer.Argument(help="Query text.")],
    also: Annotated[list[str] | None, typer.Option(
        help="Another phrasing of the same need (repeatable); all are fused with equal "
             "weight. Only for phrasings you can defend: a wrong one costs recall.")] = None,
    expand: Annotated[bool, typer.Option(help="Ask the model for an expected-answer sketch.")]
    = False,
    w: Annotated[float | None, typer.Option(
        help="Weight of the expansion clause (default: the index's profile).")] = None,
    max_n: Annotated[int | None, typer.Option(
        min=1, max=3, help="Longest sketch part validation looks up, in words (default: "
                           "the index's profile).")] = None,
    classes: Annotated[Classes | None, typer.Option(
        help="Enrichment classes that take part (default: the index's profile).")] = None,
    size: Annotated[int, typer.Option(help="Number of hits.")] = 10,
    explain: Annotated[bool, typer.Option(help="Show the sketch, validation and what "
                                          "matched per hit.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
    max_sketch_terms: SketchBudgetOpt = None,
    filter_json: Annotated[str | None, typer.Option(
        "--filter", help='A query the hits must match, not scored, e.g. '
                         '\'{"term": {"brand": "acme"}}\'.')] = None,
    index: IndexOpt = None,
) -> None:
    """Search: BM25 over the index's text + enrichment, optionally with a validated sketch."""
    settings = _settings(ctx, index)
    result = search(_connect(settings), settings, text, also=also or [], expand=expand, w=w,
                    max_n=max_n, size=size, classes=classes, explain=explain or as_json,
                    max_sketch_terms=max_sketch_terms, filter=_filter(filter_json))
    if as_json:
        sys.stdout.write(json.dumps(dataclasses.asdict(result)) + "\n")
    else:
        _print_hits(result, explain)


def _filter(text: str | None) -> dict | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _fail(f"--filter: not JSON ({exc})") from exc
    if not isinstance(value, dict) or len(value) != 1:
        raise _fail('--filter: expected one query object, e.g. {"term": {"brand": "acme"}}')
    return value


@template_app.command("install")
def template_install(ctx: typer.Context, index: IndexOpt = None) -> None:
    """Store the two-clause search template in the engine (for Kibana / Dashboards): the
    project's layout's, or with --index an attached index's (its own fields)."""
    settings = _settings(ctx)
    engine = _connect(settings)  # templates belong to the cluster, not to an index
    if not engine.capabilities.search_templates:
        raise _fail("this engine has no mustache search templates (lang-mustache module)")
    layout = Layout.of(engine.get_meta(index)) if index else OWN
    out.print(f"stored search template '{install_template(engine, layout)}'")


# -- sira profile --------------------------------------------------------------------------


def _index_bm25(engine: Engine, index: str) -> dict:
    settings = dict(engine.client.indices.get_settings(index=index))[index]["settings"]
    similarity = settings.get("index", {}).get("similarity", {}).get("sira_bm25", {})
    return {k: float(similarity[k]) for k in ("k1", "b") if k in similarity}


@profile_app.command("apply")
def profile_apply(
    ctx: typer.Context,
    path: Annotated[Path, typer.Argument(help="A profile file (`sira bench --save-profile`).")],
    index: IndexOpt = None,
) -> None:
    """Store a profile with an index: search, apply and the job use it from then on."""
    settings = _settings(ctx, index)
    try:
        profile = read_profile(path)
    except ProfileError as exc:
        raise _fail(str(exc)) from exc
    engine = _connect(settings)
    name = settings.index.name
    meta = engine.get_meta(name)
    before = Profile.for_index(meta, settings)
    engine.put_meta(name, {PROFILE_META: profile.stored()})
    out.print(f"{name}: profile stored: {profile.describe()}")
    changed = [k for k in ("w", "max_n", "classes", "max_sketch_terms")
               if getattr(before, k) != getattr(profile, k)]
    if changed:
        out.print(f"  search now uses the new {', '.join(changed)}")
    applied = meta.get("sira_filter")
    wanted = profile.filter_policy()
    if applied and policies.from_values(applied) != wanted:
        out.print(f"  the enrichment was written under another filter: `sira refilter --index "
                  f"{name}` applies {wanted.describe()} (no model calls)")
    bm25 = _index_bm25(engine, name)
    chosen = {"k1": profile.bm25_k1, "b": profile.bm25_b}
    differ = {k: (bm25.get(k), v) for k, v in chosen.items() if v is not None and
              bm25.get(k) is not None and abs(bm25[k] - v) > 1e-9}
    if differ:
        out.print("  note: the profile was chosen with BM25 " + ", ".join(
            f"{k} = {v}" for k, (_, v) in differ.items()) + "; this index has " + ", ".join(
            f"{k} = {have}" for k, (have, _) in differ.items()) + " (set when the index is "
            "created: SIRA_INDEX__BM25_K1 / SIRA_INDEX__BM25_B, then reindex)")


@profile_app.command("show")
def profile_show(ctx: typer.Context, index: IndexOpt = None) -> None:
    """What search, the template, apply and the job use for an index, and whence."""
    settings = _settings(ctx, index)
    engine = _connect(settings)
    name = settings.index.name
    meta = engine.get_meta(name)
    profile = Profile.for_index(meta, settings)
    shown = {"index": name, "profile": profile.stored(),
             "search": {"w": profile.w, "max_n": profile.max_n, "classes": profile.classes,
                        "max_sketch_terms": profile.max_sketch_terms},
             "apply": {"policy": profile.filter_policy().describe(),
                       "df_basis": settings.enrich.df_basis},
             "filter_in_force": meta.get("sira_filter"),
             "template_params": {k: v for k, v in template_params(
                 "", w=profile.w, classes=profile.classes).items() if k.startswith(("w", "skip"))},
             "index_bm25": _index_bm25(engine, name)}
    out.print_json(json.dumps(shown))


# -- enrichment ----------------------------------------------------------------------------


def _policy_options(settings: Settings, policy: PolicyKind | None, k: int | None,
                    ratio: float | None, cap: int | None, basis: DfBasis | None
                    ) -> tuple[Settings, dict]:
    """The settings with the filter flags (``stats`` shows every policy with them), and the
    flags given, to override the index's profile with."""
    given = {key: value for key, value in {
        "policy": policy, "rank_k": k, "ratio": ratio, "absolute_cap": cap,
    }.items() if value is not None}
    return _with(settings, enrich=given | ({"df_basis": basis} if basis else {})), given


def _filter_policy(engine: Engine, settings: Settings, flags: dict) -> policies.Policy:
    """The policy apply writes with: the command's flags over the index's profile."""
    stored = Profile.for_index(engine.get_meta(settings.index.name), settings)
    try:
        return stored.overridden(**flags).filter_policy()
    except ProfileError as exc:
        raise _fail(str(exc)) from exc


PolicyOpt = Annotated[PolicyKind | None, typer.Option(
    help=f"DF filter: {', '.join(policies.KINDS)} (default {policies.DEFAULT_KIND}).")]
KOpt = Annotated[int | None, typer.Option(*policies.Rank.option[:1], help=policies.Rank.option[1])]
RatioOpt = Annotated[float | None, typer.Option(*policies.Ratio.option[:1],
                                                help=policies.Ratio.option[1])]
CapOpt = Annotated[int | None, typer.Option(*policies.Absolute.option[:1],
                                            help=policies.Absolute.option[1])]
BasisOpt = Annotated[DfBasis | None, typer.Option(help="What DF counts: text, proposals, both.")]


def _print_apply(summary: enrich.ApplySummary) -> None:
    for failure in summary.rejected[:20]:
        err.print(str(failure))
    out.print(f"{summary.line()}")


MergeOpt = Annotated[bool, typer.Option(
    "--force-merge", help="End by merging the index into one segment, dropping the deleted "
    "copies that updates leave (they count in BM25 statistics and slow searches). For an "
    "index that is done being written; waits up to two minutes for the engine to release "
    "them.")]


def _force_merge(engine: Engine, index: str) -> None:
    with err.status(f"force-merging {index}"):
        merged = engine.force_merge(index)
    out.print(merge_line(merged))


@app.command("enrich")
def enrich_cmd(
    ctx: typer.Context,
    stance: Annotated[Stance | None, typer.Option(help="new: only vocabulary absent from the "
                                                  "document; new+key: also its key terms.")]
    = None,
    policy: PolicyOpt = None, k: KOpt = None, ratio: RatioOpt = None, cap: CapOpt = None,
    basis: BasisOpt = None, index: IndexOpt = None, force_merge: MergeOpt = False,
) -> None:
    """Propose terms for every document that needs them (model), then apply the DF filter."""
    settings = _settings(ctx, index)
    if stance:
        settings = _with(settings, enrich={"stance": stance})
    settings, flags = _policy_options(settings, policy, k, ratio, cap, basis)
    try:
        client = ModelClient(settings.llm)
    except NotConfigured as exc:
        raise _fail(str(exc)) from exc
    engine = _connect(settings)
    total = engine.count(settings.index.name)
    with _progress() as bars:
        proposed = enrich.propose(engine, settings, client,
                                  on_progress=bars.bar("proposing", total))
    for reason, count in proposed.reasons.most_common(5):
        err.print(f"failed {count} document(s): {reason}")
    out.print(f"propose: {proposed.line()}")
    _print_apply(enrich.apply(engine, settings, _filter_policy(engine, settings, flags)))
    if force_merge:
        _force_merge(engine, settings.index.name)
    if proposed.failed or proposed.rejected:
        raise typer.Exit(1)


@app.command("refilter")
def refilter_cmd(ctx: typer.Context, policy: PolicyOpt = None, k: KOpt = None,
                 ratio: RatioOpt = None, cap: CapOpt = None, basis: BasisOpt = None,
                 index: IndexOpt = None, force_merge: MergeOpt = False) -> None:
    """Re-apply the DF filter to the stored proposals (no model calls)."""
    settings = _settings(ctx, index)
    settings, flags = _policy_options(settings, policy, k, ratio, cap, basis)
    engine = _connect(settings)
    _print_apply(enrich.apply(engine, settings, _filter_policy(engine, settings, flags)))
    if force_merge:
        _force_merge(engine, settings.index.name)


@app.command("stats")
def stats_cmd(ctx: typer.Context, k: KOpt = None, ratio: RatioOpt = None, cap: CapOpt = None,
              basis: BasisOpt = None, index: IndexOpt = None) -> None:
    """Proposals per document, echo vs bridge, what each policy would drop, DF histogram."""
    settings = _settings(ctx, index)
    settings, _ = _policy_options(settings, None, k, ratio, cap, basis)
    out.print_json(json.dumps(enrich.stats(_connect(settings), settings)))


@app.command("export-batch")
def export_batch_cmd(
    ctx: typer.Context,
    path: Annotated[Path, typer.Argument(help="Output: a `vllm run-batch` input file.")],
    all_docs: Annotated[bool, typer.Option("--all", help="Every document, not only those "
                                           "that need proposals.")] = False,
    index: IndexOpt = None,
) -> None:
    """Write the corpus-side requests as an OpenAI batch file for `vllm run-batch`."""
    settings = _settings(ctx, index)
    count = batchfiles.export_batch(_connect(settings), settings, path, all_docs=all_docs)
    out.print(f"wrote {count} requests to {path}")


@app.command("import-proposals")
def import_proposals_cmd(
    ctx: typer.Context,
    path: Annotated[Path, typer.Argument(help="`vllm run-batch` output, or JSONL "
                                         '{"doc_id", "terms"}.')],
    model: Annotated[str | None, typer.Option(help="Model name to record.")] = None,
    prompt_version: Annotated[str | None, typer.Option(help="Prompt version to record.")]
    = None,
    apply: Annotated[bool, typer.Option(help="Apply the DF filter afterwards.")] = True,
    index: IndexOpt = None,
) -> None:
    """Store recorded proposals as the online path does, then apply the filter."""
    settings = _settings(ctx, index)
    engine = _connect(settings)
    summary = batchfiles.import_proposals(engine, settings, path, model=model,
                                          prompt_version=prompt_version)
    for problem in summary.report.problems[:20]:
        err.print(f"skipped {problem}", highlight=False)
    for failure in [*summary.refused, *summary.rejected][:20]:
        err.print(str(failure), highlight=False)
    out.print(f"import: {summary.line()}")
    if apply:
        _print_apply(enrich.apply(engine, settings))
    if summary.report.skipped or summary.refused or summary.rejected:
        raise typer.Exit(1)


# -- reindex -------------------------------------------------------------------------------


def _run_job(settings: Settings, engine: Engine, source: str | None, workers: int,
             timeout: float | None, force_merge: bool = False,
             fields: list[str] | None = None) -> JobSummary:
    from pipeline.local.workers import LocalWorkers

    if workers:
        where = redact_url(settings.worker.broker_url or "") or "the embedded broker (filesystem)"
        out.print(f"starting {workers} local worker(s) on {where}")
    with _progress() as bars:
        show = bars.counter("documents proposed or failed")
        with LocalWorkers(settings, workers) if workers else contextlib.nullcontext():
            return reindex(engine, settings, source, on_progress=show, timeout=timeout,
                           force_merge=force_merge, fields=fields)


@app.command("reindex")
def reindex_cmd(
    ctx: typer.Context,
    target: Annotated[str, typer.Option(help="The enriched index to build or update.")],
    source: Annotated[str | None, typer.Option(help="An index, a JSONL file, a BEIR or a "
                                               "Markdown folder; none: enrich what the "
                                               "target holds.")] = None,
    workers: Annotated[int, typer.Option(help="Start this many local worker processes "
                                         "(0: workers run elsewhere).")] = 0,
    timeout: Annotated[float | None, typer.Option(help="Give up after this many seconds.")]
    = None,
    force_merge: MergeOpt = False,
    fields: Annotated[str | None, typer.Option(help="For a source index of your own: the "
                                               "comma-separated text fields the model reads "
                                               "(default: the source's attached ones).")]
    = None,
) -> None:
    """Copy documents into the target, enrich them with Celery workers, apply the filter.
    A source index of your own is copied whole (its mapping, settings and every field) into
    an attached target. Re-running resumes: only pending, failed-and-retryable or changed
    documents are sent."""
    settings = _settings(ctx)
    settings = _with(settings, index={"name": target})
    if not settings.llm.url:
        raise _fail("no model server configured: set SIRA_LLM__URL (an OpenAI-compatible "
                    "/v1 URL), or import recorded proposals with `sira import-proposals`")
    engine = _connect(settings)
    try:
        summary = _run_job(settings, engine, source, workers, timeout, force_merge,
                           [f.strip() for f in fields.split(",")] if fields else None)
    except (JobFailed, CorpusError) as exc:
        raise _fail(str(exc), 1) from exc
    for problem in summary.load.problems[:20]:
        err.print(f"skipped {problem}", highlight=False)
    for failure in summary.rejected[:20]:
        err.print(str(failure), highlight=False)
    if len(summary.rejected) > 20:
        err.print(f"... and {len(summary.rejected) - 20} more rejected by the engine")
    out.print(summary.line(), highlight=False)
    if summary.failed or summary.rejected or summary.skipped_input:
        raise typer.Exit(1)


# -- your own index: attach, detach, follow, the cache ----------------------------------------


@app.command("attach")
def attach_cmd(
    ctx: typer.Context,
    index: Annotated[str, typer.Argument(help="An existing index (any mapping).")],
    fields: Annotated[str, typer.Option(help="Comma-separated text fields the model reads "
                                        "(the first plays the title).")],
    analyzer: Annotated[str | None, typer.Option(
        help="Analyzer of the enrichment fields (built in, or defined in the index); default: "
             "the first field's, so that queries on it are analysed the same way.")] = None,
) -> None:
    """Attach enrichment to an index of yours: adds the sira object to its mapping (no user
    field is touched), records the fields in its _meta, stores its search template."""
    from pipeline.attach import AttachError, attach

    settings = _settings(ctx, index)
    engine = _connect(settings)
    names = [f.strip() for f in fields.split(",")]
    policy = Profile.for_index(engine.get_meta(index) if engine.index_exists(index) else {},
                               settings).filter_policy()
    try:
        result = attach(engine, index, names, prompt_version=enrich.prompt_for(settings).version,
                        policy=policy.stored(), analyzer=analyzer)
    except AttachError as exc:
        raise _fail(str(exc)) from exc
    for line in result.changed or ["already attached with these fields: nothing to do"]:
        out.print(f"{index}: {line}", highlight=False)
    for note in result.notes:
        out.print(f"{index}: note: {note}", highlight=False)
    out.print(f"next: `sira follow {index} --once` enriches what it holds (SIRA_LLM__URL for "
              "the model); `sira follow` keeps it enriched as your writers feed it",
              highlight=False)


@app.command("detach")
def detach_cmd(ctx: typer.Context,
               index: Annotated[str, typer.Argument(help="An attached index.")]) -> None:
    """Remove what attach set that can be removed, and say what stays."""
    from pipeline.attach import AttachError, detach

    engine = _connect(_settings(ctx, index))
    try:
        result = detach(engine, index)
    except AttachError as exc:
        raise _fail(str(exc)) from exc
    for line in result.removed:
        out.print(f"{index}: removed {line}", highlight=False)
    for line in result.stays:
        out.print(f"{index}: stays: {line}", highlight=False)


@app.command("follow")
def follow_cmd(
    ctx: typer.Context,
    index: Annotated[str, typer.Argument(help="An attached index, or one of sira's own.")],
    once: Annotated[bool, typer.Option("--once", help="One round, then exit (cron, "
                                       "Kubernetes Jobs); non-zero if documents failed.")]
    = False,
    interval: Annotated[float, typer.Option(help="Seconds between rounds.")] = 30.0,
    workers: Annotated[int, typer.Option(help="Start this many local Celery workers and send "
                                         "the documents through them (0: send them from "
                                         "this process, or through the workers of "
                                         "SIRA_WORKER__BROKER_URL if set).")] = 0,
) -> None:
    """Keep an index enriched while any writer feeds it: new, overwritten and changed
    documents get proposals (from the cache, else the model), the filter follows the
    collection; prints the lag every round."""
    from pipeline.follow import Follower
    from pipeline.local.workers import LocalWorkers

    settings = _settings(ctx, index)
    engine = _connect(settings)
    if not engine.index_exists(index):
        raise _fail(f"{index}: no such index")
    client = None
    if settings.llm.url:
        client = ModelClient(settings.llm)
    else:
        out.print("no model server configured (SIRA_LLM__URL): restoring from the proposal "
                  "cache only; other documents wait", highlight=False)
    use_job = client is not None and (workers > 0 or bool(settings.worker.broker_url))
    stop = {"now": False}

    def finish(signum: int, frame: object) -> None:  # end after the round in hand
        stop["now"] = True

    with _on_sigterm(finish), \
            LocalWorkers(settings, workers) if workers else contextlib.nullcontext():
        follower = Follower(engine, settings, client,
                            run_job=(lambda: reindex(engine, settings, None)) if use_job
                            else None)
        while True:
            try:
                result = follower.round()
            except JobFailed as exc:
                raise _fail(str(exc), 1) from exc
            out.print(result.line(), highlight=False)
            for failure in result.rejected[:20]:
                err.print(str(failure), highlight=False)
            if once:
                if result.failed or result.rejected:
                    raise typer.Exit(1)
                return
            deadline = time.monotonic() + interval
            while not stop["now"] and time.monotonic() < deadline:
                time.sleep(min(1.0, interval))
            if stop["now"]:
                out.print(f"{index}: stopped (SIGTERM); the next follower carries on")
                return


@cache_app.command("stats")
def cache_stats(ctx: typer.Context) -> None:
    """Entries, size, and what they were made with."""
    from pipeline.cache import ProposalCache

    settings = _settings(ctx)
    if not settings.enrich.cache_index:
        raise _fail("the proposal cache is off (SIRA_ENRICH__CACHE_INDEX is empty)")
    out.print_json(json.dumps(ProposalCache(_connect(settings),
                                            settings.enrich.cache_index).stats()))


@cache_app.command("prune")
def cache_prune(
    ctx: typer.Context,
    older_than: Annotated[float | None, typer.Option(help="Entries older than this many "
                                                     "days.")] = None,
    model: Annotated[str | None, typer.Option(help="Entries of this model.")] = None,
    prompt_version: Annotated[str | None, typer.Option(help="Entries of this prompt "
                                                       "version.")] = None,
    keep_current_prompt: Annotated[bool, typer.Option(
        help="Entries of every prompt version but the current one.")] = False,
) -> None:
    """Delete cache entries (they only cost a model call when their text comes back)."""
    from pipeline.cache import ProposalCache

    settings = _settings(ctx)
    if not settings.enrich.cache_index:
        raise _fail("the proposal cache is off (SIRA_ENRICH__CACHE_INDEX is empty)")
    cache = ProposalCache(_connect(settings), settings.enrich.cache_index)
    keep = enrich.prompt_for(settings).version if keep_current_prompt else None
    try:
        gone = cache.prune(older_than_days=older_than, model=model,
                           prompt_version=prompt_version, keep_prompt=keep)
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    out.print(f"{cache.index}: {gone} entries deleted")


# -- bench ---------------------------------------------------------------------------------


def _bench_settings(ctx: typer.Context, dataset: Path, proposals: Path | None, k1: float,
                    b: float) -> Settings:
    """Settings of a bench index: its name carries a key of its inputs and settings, so a
    later run with the same ones reuses it."""
    from pipeline import bench

    settings = _settings(ctx)
    settings = _with(settings, index={"bm25_k1": k1, "bm25_b": b})
    key = bench.bench_key(dataset, proposals, settings)
    settings = _with(settings, index={"name": f"bench-{dataset.name}-{key}"})
    return settings


@app.command("bench")
def bench_cmd(
    ctx: typer.Context,
    dataset: Annotated[Path, typer.Option(help="A BEIR folder (corpus.jsonl, queries.jsonl, "
                                          "qrels/).")],
    proposals: Annotated[Path | None, typer.Option(help='Recorded proposals: JSONL '
                                                   '{"doc_id", "terms"} or run-batch output.')]
    = None,
    sketches: Annotated[Path | None, typer.Option(help='Recorded sketches: JSONL '
                                                  '{"query_id", "terms"}.')] = None,
    split: Annotated[str, typer.Option(help="The split reported.")] = "test",
    dev_split: Annotated[str | None, typer.Option(help="The split tuned on (default: dev, "
                                                  "else train, else held-aside queries).")]
    = None,
    k1: Annotated[float, typer.Option(help="BM25 k1 (Pyserini BEIR: 0.9).")] = 0.9,
    b: Annotated[float, typer.Option(help="BM25 b (Pyserini BEIR: 0.4).")] = 0.4,
    out_dir: Annotated[Path, typer.Option("--out", help="Where the JSON, Markdown and PNG "
                                          "go.")] = Path("bench-results"),
    recreate: Annotated[bool, typer.Option(help="Rebuild the index even if it matches.")]
    = False,
    max_sketch_terms: SketchBudgetOpt = None,
    save_profile: Annotated[Path | None, typer.Option(
        help="Write the parameters chosen on dev as a search profile (then `sira profile "
             "apply FILE --index NAME`).")] = None,
) -> None:
    """Measure every configuration on a BEIR collection; print a Markdown table."""
    from pipeline import bench

    settings = _bench_settings(ctx, dataset, proposals, k1, b)
    engine = _connect(settings)
    with _progress() as bars:
        try:
            report, runs = bench.bench(engine, settings, dataset, proposals=proposals,
                                       sketches_path=sketches, split=split,
                                       dev_split=dev_split, recreate=recreate, progress=bars.bar,
                                       max_sketch_terms=max_sketch_terms)
        except CorpusError as exc:
            raise _fail(str(exc)) from exc
    paths = bench.write(report, runs, out_dir)
    out.print(bench.markdown(report))
    out.print("\nwrote " + ", ".join(str(p) for p in paths.values()))
    if save_profile:
        profile = Profile.model_validate(report.profile)
        write_profile(save_profile, profile, report.chosen)
        out.print(f"wrote the profile chosen on dev to {save_profile}: {profile.describe()}")


@app.command("bench-latency")
def bench_latency_cmd(
    ctx: typer.Context,
    dataset: Annotated[Path, typer.Option(help="A BEIR folder.")],
    proposals: Annotated[Path | None, typer.Option(help="Recorded proposals.")] = None,
    sketches: Annotated[Path, typer.Option(help="Recorded sketches.")] = ...,
    split: Annotated[str, typer.Option(help="Queries of this split.")] = "test",
    w: Annotated[float, typer.Option(help="Weight of the expansion clause.")] = DEFAULT_W,
    repeat: Annotated[int, typer.Option(help="Passes over the queries.")] = 5,
    k1: Annotated[float, typer.Option(help="BM25 k1.")] = 0.9,
    b: Annotated[float, typer.Option(help="BM25 b.")] = 0.4,
    max_sketch_terms: SketchBudgetOpt = None,
) -> None:
    """Engine time (took) of the two-clause query against plain BM25: median, p95, ratio."""
    from pipeline import bench

    settings = _bench_settings(ctx, dataset, proposals, k1, b)
    engine = _connect(settings)
    queries, _ = bench.beir_split(dataset, split)
    known = set(load_queries(dataset / "queries.jsonl"))
    with _progress() as bars:
        bench.prepare_index(engine, settings, dataset, proposals, recreate=False)
        figures = bench.latency(engine, settings, queries, bench.load_sketches(sketches, known),
                                w=w, repeat=repeat,
                                tick=bars.bar("searching", len(queries) * repeat * 2),
                                max_sketch_terms=max_sketch_terms)
    out.print(f"{dataset.name}, {engine.kind}: {figures['queries']} queries x {repeat}, "
              f"{figures['expansion_phrases']:.1f} sketch phrases ({figures['expansion_terms']:.1f}"
              f" distinct terms) kept per query"
              + (f" (at most {max_sketch_terms} terms)" if max_sketch_terms else "")
              + ". Engine time of plain BM25 on title + text, of "
              "the literal clause alone (the template without a sketch: title + text + "
              "enrichment) and of the two-clause query with the sketch's analysed terms (as "
              "sira search sends it): the mean took (whole ms, truncated), and the mean round "
              "trip less that of an empty search (trip-0, finer):")
    table = Table()
    for column in ("index", "segs", "ms", "plain", "literal", "two-clause", "÷ plain",
                   "÷ literal"):
        table.add_column(column, justify="left" if column in ("index", "ms") else "right")
    for state in ("as written", "force-merged"):
        timings = figures[state]
        segments = str(timings["segments"]["segments"])
        table.add_row(state, segments, "took",
                      *(f"{timings[name]['mean']:.2f}" for name in bench.LATENCY_QUERIES),
                      f"{timings['ratio_bm25']['mean']:.2f}x",
                      f"{timings['ratio_literal']['mean']:.2f}x")
        table.add_row(state, segments, "trip-0",
                      *(f"{timings['excess_ms'][name]:.2f}" for name in bench.LATENCY_QUERIES),
                      f"{timings['ratio_bm25']['excess']:.2f}x",
                      f"{timings['ratio_literal']['excess']:.2f}x")
    out.print(table)
    for state in ("as written", "force-merged"):
        timings = figures[state]
        names = [n for n in (*bench.LATENCY_QUERIES, bench.PHRASES) if n in timings]
        out.print(f"{state} ({timings['segments']['deleted_docs']} deleted copies), "
                  f"{' / '.join(names)}: took median "
                  + " / ".join(f"{timings[n]['median']:.0f}" for n in names)
                  + ", p95 " + " / ".join(f"{timings[n]['p95']:.0f}" for n in names)
                  + " ms; round trip from the client, median " + " / ".join(
                      f"{timings['client_ms'][n]['median']:.2f}" for n in [*names, "empty"])
                  + " ms (the last: an empty search)")
        if bench.PHRASES in timings:
            out.print(f"  the template given the sketch phrases instead (the engine analyses "
                      f"them, one clause per phrase): mean took "
                      f"{timings[bench.PHRASES]['mean']:.2f} ms, "
                      f"{timings['ratio_literal_phrases']['mean']:.2f}x the literal clause "
                      f"({timings['ratio_literal_phrases']['excess']:.2f}x by round trips)")
    out.print(f"Sketch validation (client side, per query an _analyze and one aggregation "
              f"request): median {figures['validation_ms']['median']:.1f} ms, p95 "
              f"{figures['validation_ms']['p95']:.1f} ms. The model call is not included.")


@app.command("bench-scale")
def bench_scale_cmd(
    ctx: typer.Context,
    dataset: Annotated[Path, typer.Option(help="A BEIR folder: the real documents, and what "
                                          "the generated ones follow.")],
    proposals: Annotated[Path, typer.Option(help="Proposals recorded for it.")],
    sketches: Annotated[Path, typer.Option(help="Sketches recorded for its queries.")],
    sizes: Annotated[str, typer.Option(help="Collection sizes, comma-separated; sizes past "
                                       "the largest measured are extrapolated.")]
    = "10000,100000,1000000",
    measure_up_to: Annotated[int | None, typer.Option(
        help="Measure sizes up to this one only (the others extrapolated).")] = None,
    shards: Annotated[str, typer.Option(help="Shard counts, comma-separated.")] = "1,3",
    split: Annotated[str, typer.Option(help="Queries of this split.")] = "test",
    repeat: Annotated[int, typer.Option(help="Passes over the queries per search kind.")] = 3,
    force_merge: Annotated[bool, typer.Option(
        "--force-merge", help="Merge each index into one segment before its searches are "
        "timed (else they run once its background merges are over).")] = False,
    plain_only: Annotated[bool, typer.Option(
        "--plain-only", help="Index the documents and time validation and search only: no "
        "proposals, DF statistics or enrichment (for sizes the whole build does not fit).")]
    = False,
    cap: Annotated[int | None, typer.Option(
        help="With --plain-only: the DF cap validation counts against (default: a third of "
        "the collection, near the rank policy's).", min=1)] = None,
    aggregations: Annotated[bool, typer.Option(
        "--aggregations/--no-aggregations", help="Also time the DF statistics gathered with "
        "aggregations (as before the bounded counts; hours past a few 100,000 documents).")]
    = True,
    warm_up: Annotated[float, typer.Option(
        help="Seconds of validations and searches of other queries before each size's timed "
        "ones (an engine just started reads several times slower).", min=0)] = 60.0,
    job_workers: Annotated[int, typer.Option(
        help="Local Celery workers of the enrichment job timed at each size against the "
        "stand-in model, the proposal cache empty then filled (needs redis-server); 0 leaves "
        "the job out.", min=0)] = 2,
    out_dir: Annotated[Path, typer.Option("--out", help="Where scale.json, scale.md and "
                                          "scale.png go.")] = Path("bench-out"),
) -> None:
    """What every step costs as the collection grows: indexing, proposals, DF statistics,
    enrichment, the enrichment job, index size, sketch validation and search, per size and
    shard count."""
    from pipeline.bench import load_sketches, scale
    from pipeline.bench.synthetic import Generator, check

    try:
        asked = [int(x) for x in sizes.split(",") if x.strip()]
        shard_counts = [int(x) for x in shards.split(",") if x.strip()]
    except ValueError as exc:
        raise _fail(f"--sizes and --shards take comma-separated whole numbers ({exc})") from exc
    if cap is not None and not plain_only:
        raise _fail("--cap goes with --plain-only (a whole build validates against the cap "
                    "its filter policy gives)")
    for path in (dataset / "corpus.jsonl", proposals, sketches):
        if not path.is_file():
            raise _fail(f"{path}: no such file")
    if job_workers and not plain_only and shutil.which("redis-server") is None:
        raise _fail("the job needs redis-server on this machine (the Debian package "
                    "redis-server); --job-workers 0 leaves the job out")
    settings = _settings(ctx)
    engine = _connect(settings)
    queries, _ = beir_split(dataset, split)
    inputs = scale.Inputs(dataset, proposals, queries,
                          load_sketches(sketches, set(load_queries(dataset / "queries.jsonl"))))
    generator = Generator.fit(dataset, proposals)
    closeness = check(generator, dataset, proposals)
    out.print(f"The generator against {dataset.name} at its size (documents in random order):")
    out.print(scale.check_table(closeness))
    measured = [s for s in asked if measure_up_to is None or s <= measure_up_to]
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    measured_one = False  # a row of this run is in scale.json

    def write(results: dict[int, list[dict]]) -> str:
        nonlocal measured_one
        measured_one = True
        table = scale.markdown(results, asked)
        (out_dir / "scale.json").write_text(json.dumps(
            {"dataset": str(dataset), "engine": engine.kind, "version": engine.version,
             "phrase_terms": settings.index.phrase_terms, "plain_only": plain_only,
             "generator_check": closeness, "results": results}, indent=1))
        (out_dir / "scale.md").write_text(scale.check_table(closeness) + "\n" + table + "\n")
        return table

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # a pod deleted, a kill: stop as Ctrl-C does, cleaning up

    plan = scale.Plan(repeat, force_merge, plain_only, cap, aggregations, warm_up, job_workers)
    try:
        with _on_sigterm(interrupt):
            results = scale.run(
                engine, settings, inputs, generator, measured, shard_counts, out_dir / "work", plan,
                say=lambda line: err.print(f"[{time.monotonic() - started:6.0f}s] {line}"),
                landed=write)  # each row as it lands: a stopped run keeps them
    except JobFailed as exc:
        raise _fail(f"the enrichment job stopped: {exc} (the sizes measured before it are "
                    f"in {out_dir / 'scale.json'})") from exc
    except KeyboardInterrupt:
        kept = (f"the sizes measured before it are in {out_dir / 'scale.json'}"
                if measured_one else "no size was measured before it")
        raise _fail(f"stopped: the index and files of the size in hand were dropped; {kept}",
                    code=130) from None
    out.print(write(results))
    png = scale.plot(results, out_dir / "scale.png")
    out.print(f"\nwrote {out_dir / 'scale.json'}, {out_dir / 'scale.md'}, {png}")


@app.command("demo")
def demo(
    ctx: typer.Context,
    queries: Annotated[int, typer.Option(help="How many sample queries to show.")] = 8,
) -> None:
    """Start a local OpenSearch, index the sample collection, enrich it (the model output
    recorded for it, or the live model with SIRA_LLM__URL) and search it three ways."""
    from pipeline import demo as first_run

    settings = _settings(ctx)
    where = redact_url(settings.engine.url) if settings.engine.url else None
    if where is None:
        running = servers.load_record(settings.state_dir, LOCAL)
        if running is None or not servers.is_running(running):
            err.print("starting a local OpenSearch (fetched from Maven Central the first time "
                      "into ~/.m2, then cached; 20-40 s to start)...")
        try:
            record = servers.start("opensearch", LOCAL, settings.state_dir)
        except servers.EngineError as exc:
            raise _fail(str(exc)) from exc
        where = record.url
        out.print(f"local OpenSearch {record.version} at {record.url}")
    if settings.index.name == "sira":
        settings = _with(settings, index={"name": "sira-sample"})
    engine = _connect(settings)
    texts, qrels = beir_split(first_run.SAMPLE, "test")
    client = None
    if settings.llm.url:
        out.print(f"model server: {redact_url(settings.llm.url)}; running the enrichment job")
        try:
            summary = _run_job(settings, engine, str(first_run.SAMPLE), workers=1, timeout=600)
        except JobFailed as exc:
            raise _fail(str(exc), 1) from exc
        out.print(summary.line(), highlight=False)
        client = ModelClient(settings.llm.model_copy(update={
            "read_timeout": settings.llm.search_timeout, "max_attempts": 1}))
        sketches = None
        source = f"the live model ({settings.llm.model})"
    else:
        _index(settings, engine, first_run.SAMPLE, recreate=True)
        try:
            model, stored = first_run.replay_recorded(engine, settings)
        except first_run.ReplayFailed as exc:
            raise _fail(str(exc), 1) from exc
        sketches = first_run.recorded_sketches()
        source = f"recorded model output ({model})"
        out.print(f"No model server configured (SIRA_LLM__URL): replaying model output "
                  f"recorded once for the sample ({model}; provenance in "
                  f"pipeline/sample/recorded/README.md): proposals for {stored} notes, "
                  f"sketches for {len(sketches)} queries. No model is called.",
                  highlight=False)
    try:
        rows = first_run.compare(engine, settings, texts, qrels, sketches=sketches,
                                 client=client)
    finally:
        if client:
            client.close()
    for row in rows[:queries]:
        _print_compared(row)
    _print_first_run_measures(first_run.measures(rows, qrels), len(rows), source)
    sira = Path(sys.argv[0]).name if Path(sys.argv[0]).parent == Path() else sys.argv[0]
    out.print(f"\nThe engine is still running at {where}, index {settings.index.name}.",
              highlight=False)
    out.print(f'  search it again: {sira} search "your words" --index {settings.index.name}'
              " --explain", highlight=False)
    if settings.engine.url is None:
        out.print(f"  stop it:         {sira} engine stop", highlight=False)


def _print_compared(row: Any) -> None:
    from pipeline import demo as first_run

    table = Table(title=f"{row.query_id}: {row.text!r} (top 3)", title_justify="left")
    for config in first_run.CONFIGS:
        table.add_column(config, overflow="ellipsis", no_wrap=True, max_width=34)
    for rank in range(3):
        cells = []
        for config in first_run.CONFIGS:
            hits = row.rankings[config]
            if rank < len(hits):
                mark = "✓ " if hits[rank].id in row.judged else "  "
                cells.append(f"{mark}{hits[rank].id} {hits[rank].title}")
            else:
                cells.append("")
        table.add_row(*cells)
    out.print(table)
    firsts = [row.first_judged(c) for c in first_run.CONFIGS]
    moved = "" if len(set(firsts)) == 1 else "  <- moved"
    out.print("  judged note (✓) first at rank: " + ", ".join(
        f"{c} {f if f else '>10'}" for c, f in zip(first_run.CONFIGS, firsts, strict=True))
        + moved, highlight=False)
    if row.sketch is not None or row.note:
        out.print(f"  sketch terms kept: {', '.join(row.sketch or []) or 'none'}"
                  + (f" ({row.note})" if row.note else ""), highlight=False)


def _print_first_run_measures(figures: dict[str, dict[str, float]], n: int, source: str
                              ) -> None:
    table = Table(title=f"{n} judged sample queries, enrichment from {source}",
                  title_justify="left")
    for column in ("configuration", "nDCG@10", "R@10", "nDCG@10 vs BM25"):
        table.add_column(column, justify="left" if column == "configuration" else "right")
    base = figures["BM25"]["nDCG@10"]
    for config, values in figures.items():
        delta = "" if config == "BM25" else f"{values['nDCG@10'] - base:+.3f}"
        table.add_row(config, f"{values['nDCG@10']:.3f}", f"{values['R@10']:.3f}", delta)
    out.print(table)
    out.print(f"{n} queries show the method, they do not measure it: the measured gains are in "
              "the README's Results (public collections, with confidence intervals).",
              highlight=False)

