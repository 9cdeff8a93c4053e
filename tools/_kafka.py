"""Apache Kafka for the tests and the examples: one KRaft node (broker and controller in one
JVM) of Kafka 4.1.2, run from its jars on Maven Central.

- :func:`kafka_jars`: ``kafka_2.13`` 4.1.2 and what it needs at run time, plus
  ``log4j-slf4j-impl`` (without a binding the broker logs nothing, not even why it
  stopped): 46 jars, 43 MB, pinned by coordinates and sha256.
- :func:`kafka_libs`: those jars in ``$LOCKSTEP_CACHE/kafka-4.1.2`` (else
  ``~/.cache/lockstep/kafka-4.1.2``), fetched once by :mod:`lockstep.barrier.jars` (checked,
  renamed only when whole; ``$LOCKSTEP_MAVEN_REPOSITORY`` for a mirror), offline afterwards.
- :class:`KafkaBroker`: a broker on loopback, its data in a temporary folder; ready once its
  port answers a Metadata request listing a broker; stopped by its PID, data removed.

A broker to try the examples against (Java 17 or later)::

    .venv/bin/python tools/_kafka.py --port 9092      # until Ctrl-C
    KAFKA_BOOTSTRAP=127.0.0.1:9092 python -m lockstep.examples.orders_kafka produce
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import FrameType, TracebackType

from _installed import support_importable
from _processes import java_major

from lockstep.barrier.jars import MavenArtifact, cache_dir, fetch_artifact

KAFKA_VERSION = "4.1.2"
JAVA_MIN = 17  # Kafka 4's broker: class files of Java 17
START_TIMEOUT_S = 60.0
STOP_GRACE_S = 15.0
# small and quick to start on two shared cores: serial GC, C1 only
JVM_OPTIONS = ("-Xms64m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
               "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true")  # fmt: skip

# The jars of Kafka 4.1.2's broker: kafka_2.13 and its run-time dependencies as Maven resolves
# them, plus log4j-slf4j-impl (the binding of Kafka's log4j 2.25.3). Under each "group
# version", "name sha256": the sha256 of the file on Maven Central, checked against the
# .sha1 published beside it (all 46) and the .sha256 (the 37 that have one).
_PINNED = """
org.apache.kafka 4.1.2
  kafka-clients afe861c05067f4018a3148d73c1ed1e5fc90808757c15b043527d7e535a5d431
  kafka-coordinator-common 0e6697b6827fa635b4686ec9754b1c5583f4997e9bc0f33a8518f1dee518a454
  kafka-group-coordinator 1925a002ef7c527b72a0877ed0d9f3a5f88a08d130d1ed2bdfcc40457ded354b
  kafka-group-coordinator-api 781f932fb3e3824420e7554ef745b57e1827dd801cfc71bf8fd31eef56e60638
  kafka-metadata ccc29f5423cf5fbe63b47871dbce00a16e05a38bd0d531b3bf21e5c71ba54fac
  kafka-raft 01f6717d07472b577a1cfe1cdf4d098b14a1dae4e35574164712801bd2a55cce
  kafka-server 2b849f1c9d3d9a08a5ea4c2f0479c552592cd770d72263d8d1610701a9b3e8d4
  kafka-server-common 0f1d8fb9478ca0e3eea23b81064749738b9bff705704067e2fe8d62047e5fc07
  kafka-share-coordinator fffacfaa46e7f25696f673035f86669422ae81889dfd28d8fec29500ee888310
  kafka-storage 902a08f775a9957e1546ecec8e22fbda73b84be9dfbdf04cce7a023dd60bf8b9
  kafka-storage-api 79910cc7d0e3d3a9d9ce6f30f6f000cd355321f604a0f6c73c948389d1b41457
  kafka-tools-api 6d4d6a33b0dcd2180e7489c58c0089f8fb502e7a095cdd46f57755df462f00ae
  kafka-transaction-coordinator 20939d46e1e65a34d6a59b447f0a5e63721678abbfdc948a5f9422930d71612c
  kafka_2.13 965af2d9c19be0c169110eb18468a0bee24e24d14071a57c7f8a57bc4d3f990e
at.yawk.lz4 1.10.1
  lz4-java a58a84c4271e50df4c96ed916ccb7e48a869f8ed9cdcda1ad5d3d4c33b0214a3
com.dynatrace.hash4j 0.22.0
  hash4j 23028a3fd006e530bf495f551083208187cafd8f80624d048eba56442f16a50e
com.fasterxml.jackson.core 2.19.4
  jackson-annotations ab26383fa3c10c0df1ffd1bb035d81161c059b1af71927d73c24473c058baa16
  jackson-core 466ae4dc4f7054f51525f4211df411d9a64d65cc169995d32bf49e20e6f586e5
  jackson-databind b781c431be870deb0bf84421e99e774c256a701f4ba678df80248f55cd16ff74
com.fasterxml.jackson.dataformat 2.19.4
  jackson-dataformat-csv fc06cf56909e43e0cdc84ad5e23069fcc4d503a8833bda348f47e50e8f1ac92c
  jackson-dataformat-yaml 998e652806c49ca59e2b6432c4edc37580c4702cb6189d10e6053d0b7982c2e7
com.fasterxml.jackson.datatype 2.19.4
  jackson-datatype-jdk8 c0e0dc3039f9a37a099b2602838f833ea8c15c56445a0eb5463d0c7e0c355da2
com.github.ben-manes.caffeine 3.2.0
  caffeine ec411dfdf0c03f25218648ce89861630b71680e5858a9a7278ebac8e55cab3d7
com.github.luben 1.5.6-10
  zstd-jni b6c3237e24b8252a5a9c3a0e1ae30ef8f323412e74bd358548b7a9e527d676df
com.google.re2j 1.8
  re2j 7b52c72156dd7f98b3237a5b35c1d34fba381b21048c89208913ad80a45dfbd7
com.typesafe.scala-logging 3.9.5
  scala-logging_2.13 87a3017d3f43e6ace7566fe4c3d615134c6914ff871c8d64bb32ca1d996d0545
com.yammer.metrics 2.2.0
  metrics-core 6b7a14a6f34c10f8683f7b5e2f39df0f07b58c7dff0e468ebbc713905c46979c
commons-beanutils 1.11.0
  commons-beanutils 9e44ba68ec9a3f21286fa2a8bbb003b735c0f69101bb43144b79f4f8aaa74709
commons-collections 3.2.2
  commons-collections eeeae917917144a68a741d4c0dff66aa5c5c5fd85593ff217bced3fc8ca783b8
commons-digester 2.1
  commons-digester e0b2b980a84fc6533c5ce291f1917b32c507f62bcad64198fff44368c2196a3d
commons-logging 1.3.5
  commons-logging 6d7a744e4027649fbb50895df9497d109f98c766a637062fe8d2eabbb3140ba4
commons-validator 1.10.1
  commons-validator ed74711a78d793ca37f6075e4a1e93d107233dfd20d0bb17e32bad88d38e56aa
net.sf.jopt-simple 5.0.4
  jopt-simple df26cc58f235f477db07f753ba5a3ab243ebe5789d9f89ecf68dd62ea9a66c28
net.sourceforge.argparse4j 0.7.0
  argparse4j 65ceb669d88f63306c680f8088bbf765bbca72d288a61a03703000076c3d3f56
org.apache.logging.log4j 2.25.3
  log4j-api e886682920fa0fb9d6eb6395dcb4de088443f8646c89c5e5846e168e327f406f
  log4j-core 362b7fcb65b73aa46cc4bc53abf4eb216f444a83b5d1a037cb6fdfff0ae9f0f9
  log4j-slf4j-impl f835ac2bf1a895d5e687b4ebf238bff05316dd672e572dff235024b6e320bcc9
org.bitbucket.b_c 0.9.6
  jose4j 7314af50cde9c99e8eaf43eee617a23edcc6bb43036221064355094999d837ef
org.hdrhistogram 2.2.2
  HdrHistogram 22d1d4316c4ec13a68b559e98c8256d69071593731da96136640f864fa14fad8
org.jspecify 1.0.0
  jspecify 1fad6e6be7557781e4d33729d49ae1cdc8fdda6fe477bb0cc68ce351eafdfbab
org.pcollections 4.0.2
  pcollections 2bbeef5797a241300c4f7513cd546239629ed7deda4fc0c31df90bb95f5f13ef
org.scala-lang 2.13.16
  scala-library 1ebb2b6f9e4eb4022497c19b1e1e825019c08514f962aaac197145f88ed730f1
  scala-reflect fb49ccd9cac7464486ab993cda20a3c1569d8ef26f052e897577ad2a4970fb1d
org.slf4j 1.7.36
  slf4j-api d3ef575e3e4979678dc01bf1dcce51021493b4d11fb7f1be8ad982877c16a1c0
org.xerial.snappy 1.1.10.7
  snappy-java 4c766cb3f855415ee734b2392949a0b6f12a60879334a74518deaf6270d32e36
org.yaml 2.4
  snakeyaml ef779af5d29a9dde8cc70ce0341f5c6f7735e23edff9685ceaa9d35359b7bb7f
"""
# Warnings and errors only, on stderr (the broker's log file): a start says 1-3 lines.
LOG4J2_YAML = """\
Configuration:
  Appenders:
    Console:
      name: STDERR
      target: SYSTEM_ERR
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: WARN
      AppenderRef:
        - ref: STDERR
"""


class KafkaUnavailable(RuntimeError):
    """Kafka cannot run here: no Java 17 or later (a failed fetch is lockstep's FetchError)."""


class KafkaStartError(RuntimeError):
    """The broker did not start; the message ends with its log's tail."""


# -- the jars ---------------------------------------------------------------------------------


def kafka_jars() -> list[MavenArtifact]:
    """The broker's pinned jars.

    >>> jars = kafka_jars()
    >>> len(jars), jars[0].coordinates
    (46, 'org.apache.kafka:kafka-clients:4.1.2')
    """
    jars = []
    group = version = ""
    for line in _PINNED.strip().splitlines():
        if line.startswith(" "):
            name, sha256 = line.split()
            jars.append(MavenArtifact(group, name, version, sha256))
        else:
            group, version = line.split()
    return jars


def kafka_libs() -> Path:
    """The folder of the broker's jars, each fetched (and checked) on first use; a lock keeps
    two processes (two test workers) from fetching them at once. FetchError if one cannot be
    downloaded or is not the pinned file."""
    folder = cache_dir() / f"kafka-{KAFKA_VERSION}"
    if not _missing(folder):
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder.with_name(f"{folder.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be fetching them: wait
        missing = _missing(folder)
        if missing:
            started = time.monotonic()
            _progress(f"fetching {len(missing)} jars into {folder}")
            with ThreadPoolExecutor(4) as pool:
                list(pool.map(lambda jar: fetch_artifact(jar, folder, _progress), missing))
            _progress(f"fetched {len(missing)} jars in {time.monotonic() - started:.1f} s")
    return folder


def _missing(folder: Path) -> list[MavenArtifact]:
    return [jar for jar in kafka_jars() if not (folder / jar.file_name).is_file()]


def _progress(message: str) -> None:
    print(f"kafka {KAFKA_VERSION}: {message.strip()}", file=sys.stderr, flush=True)


def class_path(libs: Path) -> str:
    """Exactly the pinned jars (not ``libs/*``: nothing else in the folder is loaded)."""
    return os.pathsep.join(str(libs / jar.file_name) for jar in kafka_jars())


# -- Java -------------------------------------------------------------------------------------


def java_command() -> Path:
    """``$JAVA_HOME/bin/java``, else ``java`` on PATH; KafkaUnavailable if there is none, or
    if its ``release`` file says it is older than Java 17."""
    home = os.environ.get("JAVA_HOME")
    found = Path(home) / "bin" / "java" if home else None
    if found is None or not found.is_file():
        on_path = shutil.which("java")
        found = Path(on_path) if on_path else None
    if found is None:
        raise KafkaUnavailable(f"no java: Kafka {KAFKA_VERSION} needs Java {JAVA_MIN} or later")
    major = java_major(found.resolve().parent.parent)
    if major is not None and major < JAVA_MIN:
        raise KafkaUnavailable(
            f"{found} is Java {major}: Kafka {KAFKA_VERSION} needs Java {JAVA_MIN} or later "
            "(set JAVA_HOME)"
        )
    return found


# -- the broker -------------------------------------------------------------------------------


def server_properties(port: int, controller_port: int, data: Path) -> dict[str, str]:
    """A node that is its own controller and only broker, on loopback, for tests."""
    loopback = "127.0.0.1"
    return {
        "process.roles": "broker,controller",
        "node.id": "1",
        "listeners": f"PLAINTEXT://{loopback}:{port},CONTROLLER://{loopback}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{loopback}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "controller.quorum.voters": f"1@{loopback}:{controller_port}",  # static: no --standalone
        "log.dirs": str(data),
        "num.partitions": "1",
        # topics are created explicitly: a typo, or a metadata lookup, must not create one
        "auto.create.topics.enable": "false",
        # one broker: internal topics of one replica (and one partition: a group's or a
        # transaction's coordinator is ready sooner)
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        # the tests stamp records on a fixed timeline (2026-01-01): the default retention
        # (7 days) deletes them 30 s after the start, and Kafka 4 refuses timestamps more
        # than an hour ahead of its clock
        "log.retention.ms": "-1",
        "log.message.timestamp.after.max.ms": str(2**63 - 1),
        # a node restarted after SIGKILL registers only once its old session expired (9 s)
        "broker.heartbeat.interval.ms": "500",
        "broker.session.timeout.ms": "1500",
    }


def cluster_id() -> str:
    """What ``kafka-storage random-uuid`` prints: 16 random bytes in URL-safe base64, never
    starting with ``-`` (the format command would take it for an option)."""
    while True:
        found = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not found.startswith("-"):
            return found


def metadata_lists_a_broker(host: str, port: int) -> bool:
    """Does ``host:port`` answer a Metadata request (v1, no topics) listing a broker? The
    broker's port accepts only once the node is unfenced, and then it serves at once."""
    # request header: api key 3, version 1, correlation id 1, client id "t"; no topics
    request = b"\x00\x03\x00\x01\x00\x00\x00\x01\x00\x01t\x00\x00\x00\x00"
    try:
        with socket.create_connection((host, port), timeout=1.0) as s, s.makefile("rb") as got:
            s.sendall(len(request).to_bytes(4, "big") + request)
            size = int.from_bytes(got.read(4), "big")
            answer = got.read(size)
    except OSError:
        return False
    # correlation id (4 bytes), then the length of the brokers array
    return len(answer) >= 8 and int.from_bytes(answer[4:8], "big", signed=True) > 0


class KafkaBroker:
    """One Kafka node on loopback: :meth:`start` gives its bootstrap servers, :meth:`stop`
    ends it by its PID and removes its folder (configuration, data and log).

    >>> with KafkaBroker() as broker:  # doctest: +SKIP
    ...     produce(broker.bootstrap, "orders", records)
    """

    host = "127.0.0.1"

    def __init__(
        self,
        libs: Path | None = None,
        *,
        java: Path | None = None,
        timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        self.libs = libs  # None: kafka_libs() when started
        self.java = java  # None: java_command() when started
        self.timeout_s = timeout_s
        self.port: int | None = None
        self.folder: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        if self.port is None:
            raise RuntimeError("the Kafka broker is not started")
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def __enter__(self) -> KafkaBroker:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self, port: int | None = None) -> str:
        """Format a fresh folder and start the node on ``port`` (default: a free one); its
        bootstrap servers once it serves. KafkaStartError (with its log's tail) if it is not
        ready within ``timeout_s``; KafkaUnavailable, FetchError if it cannot run here."""
        if self._process is not None:
            raise RuntimeError(f"the Kafka broker already runs (pid {self.pid})")
        java = self.java or java_command()
        libs = self.libs or kafka_libs()
        deadline = time.monotonic() + self.timeout_s
        support_importable()
        from support.ports import free_port

        self.port = port or free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="lockstep-kafka-"))
        try:
            config = self.folder / "server.properties"
            controller_port = free_port()
            while controller_port == self.port:  # the same free port twice: ask again
                controller_port = free_port()
            settings = server_properties(self.port, controller_port, self.folder / "data")
            config.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
            (self.folder / "log4j2.yaml").write_text(LOG4J2_YAML)
            jvm = [str(java), *JVM_OPTIONS, f"-Dlog4j2.configurationFile={self.folder}/log4j2.yaml"]
            jvm += ["-cp", class_path(libs)]
            self._format(jvm, config, deadline)
            with (self.folder / "broker.log").open("wb") as log:
                self._process = subprocess.Popen(
                    [*jvm, "kafka.Kafka", str(config)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # a Ctrl-C meant for the tests is not its
                )
            self._wait_ready(self._process, deadline)
        except BaseException:
            self.stop()
            raise
        return self.bootstrap

    def _format(self, jvm: list[str], config: Path, deadline: float) -> None:
        """``kafka-storage format``: the node's metadata log, for a new cluster id."""
        command = [*jvm, "kafka.tools.StorageTool", "format", "--config", str(config)]
        command += ["--cluster-id", cluster_id()]
        timeout = max(1.0, deadline - time.monotonic())
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise KafkaStartError(f"formatting Kafka's storage took over {timeout:.0f} s") from e
        if done.returncode != 0:
            output = (done.stdout + done.stderr)[-4000:]
            raise KafkaStartError(
                f"formatting Kafka's storage failed ({done.returncode}):\n{output}"
            )

    def _wait_ready(self, process: subprocess.Popen[bytes], deadline: float) -> None:
        while not metadata_lists_a_broker(self.host, int(self.port or 0)):
            if process.poll() is not None:
                why = f"exited ({process.returncode}) before it served"
            elif time.monotonic() > deadline:
                why = f"did not serve on {self.bootstrap} within {self.timeout_s:.0f} s"
            else:
                time.sleep(0.1)  # nothing to wait on but the port
                continue
            raise KafkaStartError(f"Kafka {why}:\n{self.log_tail()}")

    def wait(self) -> int:
        """Until the broker exits (by itself, or stopped from elsewhere): its exit code."""
        if self._process is None:
            raise RuntimeError("the Kafka broker is not started")
        return self._process.wait()

    def log_tail(self, chars: int = 4000) -> str:
        if self.folder is None:
            return ""
        try:
            return (self.folder / "broker.log").read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM to the broker's PID (a clean shutdown), SIGKILL after 15 s; then its folder
        is removed. Safe to call again, or on a broker that never started."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGKILL)
                process.wait()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None


# -- command line -----------------------------------------------------------------------------


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=f"Apache Kafka {KAFKA_VERSION} (one KRaft node) on loopback until Ctrl-C"
    )
    parser.add_argument("--port", type=int, default=None, help="its port (default: a free one)")
    parser.add_argument("--fetch", action="store_true", help="only fetch its jars, then exit")
    args = parser.parse_args(argv)
    from lockstep.barrier.jars import FetchError

    broker = KafkaBroker()
    signal.signal(signal.SIGTERM, _interrupt)  # stopped like Ctrl-C: the broker goes too
    try:
        if args.fetch:
            print(kafka_libs())
            return 0
        bootstrap = broker.start(args.port)
        print(f"Apache Kafka {KAFKA_VERSION} on {bootstrap} (pid {broker.pid}); Ctrl-C stops it")
        print(f"export KAFKA_BOOTSTRAP={bootstrap}", flush=True)
        code = broker.wait()
        print(f"Kafka exited ({code}):\n{broker.log_tail()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    except (KafkaUnavailable, KafkaStartError, FetchError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        broker.stop()


if __name__ == "__main__":
    sys.exit(main())
