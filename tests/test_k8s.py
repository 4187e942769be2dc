"""The Kubernetes manifests, validated offline: every overlay rendered by kustomize, every
object checked against the Kubernetes OpenAPI schemas that kubernetes-validate ships."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

K8S = Path(__file__).resolve().parent.parent / "k8s"
K8S_VERSION = "1.37.0"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if p.is_dir())
PLACEHOLDER = "REPLACE_ME"


def kustomize() -> str:
    found = os.environ.get("SIRA_KUSTOMIZE") or shutil.which("kustomize") or \
        str(Path.home() / "go" / "bin" / "kustomize")
    if not Path(found).exists():
        raise RuntimeError("kustomize not found: `go install sigs.k8s.io/kustomize/kustomize/"
                           "v5@v5.7.1` (.ci/run does), or set SIRA_KUSTOMIZE")
    return found


def render(path: Path) -> list[dict]:
    out = subprocess.run([kustomize(), "build", str(path)], capture_output=True, text=True,
                         check=True).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def containers(obj: dict) -> list[dict]:
    spec = obj.get("spec", {})
    pod = spec.get("template", {}).get("spec", {}) if "template" in spec else {}
    return pod.get("initContainers", []) + pod.get("containers", [])


def lacking_requests(objects: list[dict]) -> list[str]:
    return [f"{o['kind']}/{o['metadata']['name']}: {c['name']}"
            for o in objects for c in containers(o)
            if not {"cpu", "memory"} <= set(c.get("resources", {}).get("requests", {}))]


def non_placeholder_secrets(objects: list[dict]) -> list[str]:
    return [f"{o['metadata']['name']}.{key}" for o in objects if o["kind"] == "Secret"
            for section in ("data", "stringData") for key, value in o.get(section, {}).items()
            if value != PLACEHOLDER]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_to_valid_manifests(overlay: str) -> None:
    objects = render(K8S / "overlays" / overlay)
    assert objects
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    assert lacking_requests(objects) == []
    assert non_placeholder_secrets(objects) == []
    for obj in objects:
        for c in containers(obj):
            gpu = c["resources"].get("requests", {}).get("nvidia.com/gpu")
            if gpu:
                assert c["resources"]["limits"]["nvidia.com/gpu"] == gpu, c["name"]


def test_overlays_wire_the_pieces_together() -> None:
    base = {(o["kind"], o["metadata"]["name"]): o for o in render(K8S / "overlays" / "opensearch")}
    config = base[("ConfigMap", "sira-config")]["data"]
    worker = base[("Deployment", "sira-worker")]["spec"]["template"]["spec"]
    assert worker["terminationGracePeriodSeconds"] > int(config["SIRA_WORKER__TIME_LIMIT"])
    assert "--prefetch-multiplier=1" in worker["containers"][0]["args"]
    job = base[("Job", "sira-reindex")]["spec"]
    assert job["template"]["spec"]["restartPolicy"] == "OnFailure"
    assert job["backoffLimit"] > 0 and job["activeDeadlineSeconds"] > 0
    follow = base[("Deployment", "sira-follow")]["spec"]
    assert follow["replicas"] == 1 and follow["strategy"]["type"] == "Recreate"
    assert follow["template"]["spec"]["containers"][0]["command"] == ["sira", "follow"]
    assert follow["template"]["spec"]["terminationGracePeriodSeconds"] > \
        int(config["SIRA_WORKER__TIME_LIMIT"])
    assert "FOLLOW_INDEX" in base[("ConfigMap", "sira-follow")]["data"]
    vllm = base[("Deployment", "vllm")]["spec"]["template"]["spec"]["containers"][0]
    assert vllm["startupProbe"]["httpGet"]["path"] == "/health"
    assert config["SIRA_LLM__URL"].startswith("http://vllm:")
    elastic = {(o["kind"], o["metadata"]["name"]): o
               for o in render(K8S / "overlays" / "elasticsearch")}
    assert elastic[("ConfigMap", "sira-config")]["data"]["SIRA_ENGINE__KIND"] == "elasticsearch"
    local = {(o["kind"], o["metadata"]["name"]) for o in render(K8S / "overlays" / "local")}
    assert ("Deployment", "vllm") not in local


def test_example_secret_and_keda_scaler() -> None:
    secrets = list(yaml.safe_load_all((K8S / "secret.example.yaml").read_text()))
    for secret in secrets:
        kubernetes_validate.validate(secret, K8S_VERSION, strict=True)
    assert non_placeholder_secrets(secrets) == []
    # KEDA's ScaledObject is a custom resource: not in the Kubernetes schemas, checked here
    scaler = yaml.safe_load((K8S / "optional" / "keda-scaledobject.yaml").read_text())
    base = render(K8S / "base")
    names = {o["metadata"]["name"] for o in base if o["kind"] == "Deployment"}
    queue = next(o for o in base if o["metadata"]["name"] == "sira-config")["data"][
        "SIRA_WORKER__QUEUE"]
    assert scaler["spec"]["scaleTargetRef"]["name"] in names
    assert scaler["spec"]["triggers"][0]["metadata"]["listName"] == queue


def test_the_checks_can_fail() -> None:
    bad = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
           "spec": {"replicas": "two", "selector": {}, "template": {"spec": {"containers": [
               {"name": "c", "image": "i"}]}}}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)
    assert lacking_requests([bad]) == ["Deployment/x: c"]
    leaked = {"kind": "Secret", "metadata": {"name": "s"}, "stringData": {"password": "hunter2"}}
    assert non_placeholder_secrets([leaked]) == ["s.password"]
