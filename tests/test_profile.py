"""The search profile: what the bench chose is what search, apply and the template use.
Pure units first (no engine), then the commands against the real engines."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest
from test_bench import make_collection
from test_cli import engine_env, runner
from test_query import DOCS, build

from pipeline import profile as profiles
from pipeline.cli import app
from pipeline.config import EnrichSettings, IndexSettings, Settings
from pipeline.engine import Engine, mappings_dir
from pipeline.profile import Profile, ProfileError


def test_precedence_flag_over_stored_over_settings() -> None:
    settings = Settings(enrich=EnrichSettings(policy="ratio", ratio=0.01))
    base = Profile.for_index({}, settings)
    assert (base.policy, base.ratio, base.w) == ("ratio", 0.01, profiles.DEFAULT_W)
    stored = Profile.for_index({profiles.META_KEY: {"w": 1.5, "rank_k": 10, "policy": "rank",
                                                    "origin": "bench x"}}, settings)
    assert (stored.w, stored.policy, stored.rank_k, stored.ratio) == (1.5, "rank", 10, 0.01)
    assert stored.origin == "bench x"
    flagged = stored.overridden(w=0.2, max_n=None, classes="echo")
    assert (flagged.w, flagged.classes, flagged.max_n) == (0.2, "echo", stored.max_n)
    assert "--w, --classes from the command line" in flagged.origin
    assert stored.overridden(w=None) is stored
    assert flagged.filter_policy().describe() == "rank K=10"
    with pytest.raises(ProfileError, match="max_n"):
        stored.overridden(max_n=7)


def test_profile_files_are_checked(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    profiles.write_file(path, Profile(w=1.0, max_n=1, rank_k=25, origin="by hand"), {})
    read = profiles.read_file(path)
    assert (read.w, read.max_n, read.rank_k, read.origin) == (1.0, 1, 25, "by hand")
    path.write_text('{"w": 0.3}')
    assert (profiles.read_file(path).w, profiles.read_file(path).origin) == (0.3, str(path))
    for text, error in (('{"w": -1}', "w: Input should be greater than or equal to 0"),
                        ('{"wieght": 1}', "wieght: Extra inputs are not permitted"),
                        ("[1]", "expected a JSON object"), ("{", "not a JSON file")):
        path.write_text(text)
        with pytest.raises(ProfileError, match=re.escape(error)):
            profiles.read_file(path)
    with pytest.raises(ProfileError, match="no such file"):
        profiles.read_file(tmp_path / "missing.json")


def test_the_template_default_weight_is_the_profile_default() -> None:
    template = mappings_dir().joinpath("search-template.mustache").read_text("utf-8")
    defaults = set(re.findall(r"\{\{\^w\}\}([0-9.]+)\{\{/w\}\}", template))
    assert defaults == {str(profiles.DEFAULT_W)}


def test_search_and_refilter_use_the_stored_profile(engine: Engine, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    engine_env(engine, monkeypatch)
    name = f"test-prof-{uuid.uuid4().hex[:8]}"
    build(engine, name)
    try:
        # w = 0 in the profile: an expanded search ranks as the literal query alone
        path = tmp_path / "p.json"
        path.write_text(json.dumps({"w": 0.0, "policy": "absolute", "absolute_cap": 1}))
        applied = runner.invoke(app, ["profile", "apply", str(path), "--index", name])
        assert applied.exit_code == 0, applied.output
        assert "`sira refilter --index" in applied.output  # the filter in force differs
        shown = json.loads(runner.invoke(app, ["profile", "show", "--index", name]).stdout)
        assert shown["search"]["w"] == 0.0 and shown["apply"]["policy"] == "absolute 1"
        assert shown["template_params"]["w"] == 0.0

        def top(*flags: str) -> list[str]:
            result = runner.invoke(app, ["search", "object storage", "--index", name,
                                         "--json", *flags])
            assert result.exit_code == 0, result.output
            return [h["id"] for h in json.loads(result.stdout)["hits"]]

        assert top() == ["snap"]
        # sketch terms only through the Python API; the flag overrides the stored w
        from pipeline import query
        settings = Settings(index=IndexSettings(name=name))
        stored = query.search(engine, settings, "memory", expansion=["backup"])
        assert stored.profile["w"] == 0.0 and [h.id for h in stored.hits][0] != "snap"
        flagged = query.search(engine, settings, "memory", expansion=["backup"], w=2.0)
        assert [h.id for h in flagged.hits][0] == "snap"
        assert "from the command line" in flagged.profile["origin"]

        explained = runner.invoke(app, ["search", "memory", "--index", name, "--explain"])
        assert "profile: w 0, max_n 2" in explained.output, explained.output

        # refilter without flags applies the stored policy; a flag overrides it
        refilter = runner.invoke(app, ["refilter", "--index", name])
        assert "policy absolute 1" in refilter.output, refilter.output
        refilter = runner.invoke(app, ["refilter", "--index", name, "--policy", "none"])
        assert "policy none" in refilter.output, refilter.output

        bad = tmp_path / "bad.json"
        bad.write_text('{"classes": "all"}')
        refused = runner.invoke(app, ["profile", "apply", str(bad), "--index", name])
        assert refused.exit_code == 2 and "classes" in refused.output
        assert len(DOCS) == engine.count(name)
    finally:
        engine.delete_index(name)


def test_bench_saves_the_profile_it_chose(opensearch: Engine, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    engine_env(opensearch, monkeypatch)
    dataset, proposals, sketches = make_collection(tmp_path / "tiny")
    saved = tmp_path / "profile.json"
    result = runner.invoke(app, ["bench", "--dataset", str(dataset), "--proposals",
                                 str(proposals), "--sketches", str(sketches), "--out",
                                 str(tmp_path / "out"), "--save-profile", str(saved)])
    try:
        assert result.exit_code == 0, result.output
        written = json.loads(saved.read_text())
        report = json.loads((tmp_path / "out" / "tiny.json").read_text())
        chosen = report["chosen"]
        assert written["profile"]["w"] == chosen["doc+query.w"]["value"]
        assert written["profile"]["max_n"] == chosen["doc+query.max_n"]["value"]
        assert written["profile"]["rank_k"] == chosen["rank.rank_k"]["value"]
        assert (written["profile"]["bm25_k1"], written["profile"]["bm25_b"]) == (0.9, 0.4)
        assert "sira bench tiny" in written["profile"]["origin"]
        # the doc+query row is the configuration the profile describes
        row = report["rows"]["doc+query"]
        assert (row["w"], row["max_n"]) == (written["profile"]["w"],
                                            written["profile"]["max_n"])
    finally:
        for name in opensearch.client.indices.get(index="bench-tiny-*"):
            opensearch.delete_index(name)
