"""Issue 14, part 3: no password, token or secret is committed; the generated one stays home.

The other two security promises are tested on the running service in
tests/integration/test_service.py: anonymous requests to the Airflow API and the
Rebalance view are refused (``test_anonymous_requests_to_the_rebalance_view_are_refused``)
and every process listens on 127.0.0.1 only
(``test_every_process_of_the_service_listens_on_loopback_only``).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PASSWORD_FILE = "simple_auth_manager_passwords.json.generated"

#: Shapes of real credentials (never of a placeholder such as ``admin:admin`` user lists).
SECRET_PATTERNS = {
    "private key": r"-----BEGIN [A-Z ]*PRIVATE KEY-----",
    "AWS access key id": r"\bAKIA[0-9A-Z]{16}\b",
    "GitHub token": r"\bgh[pousr]_[A-Za-z0-9]{36,}\b",
    "Slack token": r"\bxox[abprs]-[A-Za-z0-9-]{10,}",
    "API key sk-": r"\bsk-[A-Za-z0-9]{32,}\b",
    "JWT": r"\beyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}",
    # simple auth manager's generated file is {"admin": "<16 random characters>"}
    "generated admin password": r"\"admin\"\s*:\s*\"[A-Za-z0-9]{16}\"",
    "secret assignment": (r"(?i)\b(?:aws_secret_access_key|secret_key|api_key|access_token|"
                          r"fernet_key|jwt_secret|AIRFLOW__API_AUTH__JWT_SECRET|"
                          r"AIRFLOW__CORE__FERNET_KEY)\s*[=:]\s*['\"]?[A-Za-z0-9+/=_-]{16,}"),
}


def _tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True)
    return [REPO / p for p in out.stdout.decode().split("\0") if p]


def _text(path: Path) -> str | None:
    try:
        data = path.read_bytes()
    except OSError:  # listed but deleted in the working tree
        return None
    if b"\0" in data[:8192]:
        return None  # binary (PNG screenshots)
    return data.decode("utf-8", errors="replace")


@pytest.fixture(scope="module")
def tracked():
    files = _tracked()
    assert len(files) > 50, "git ls-files found too little: the scan would prove nothing"
    return {p: t for p in files if (t := _text(p)) is not None}


def test_no_secret_is_committed(tracked):
    found = []
    for path, text in tracked.items():
        for name, pattern in SECRET_PATTERNS.items():
            for m in re.finditer(pattern, text):
                found.append(f"{path.relative_to(REPO)}: {name}: {m.group(0)[:40]}")
    assert not found, "\n".join(found)


def test_the_patterns_catch_what_they_are_for():
    """Each pattern matches a made-up credential of its kind (so the scan can fail)."""
    samples = {
        # (split literals: this file is scanned too)
        "private key": "-----BEGIN RSA " + "PRIVATE KEY-----",
        "AWS access key id": "AKIA" + "ABCDEFGHIJKLMNOP",
        "GitHub token": "ghp_" + "a" * 36,
        "Slack token": "xoxb-" + "1234567890-abc",
        "API key sk-": "sk-" + "A" * 40,
        "JWT": "eyJ" + "a" * 12 + ".eyJ" + "b" * 12 + "." + "c" * 12,
        "generated admin password": json.dumps({"admin": "Ab3dEf6h" + "Ij9kLm2n"}),
        "secret assignment": "AIRFLOW__API_AUTH__JWT_SECRET=" + "q" * 24,
    }
    assert set(samples) == set(SECRET_PATTERNS)
    for name, sample in samples.items():
        assert re.search(SECRET_PATTERNS[name], sample), name


def test_no_password_file_or_airflow_home_is_tracked():
    names = [p.relative_to(REPO).as_posix() for p in _tracked()]
    assert not [n for n in names if n.endswith(PASSWORD_FILE) or n.startswith((".airflow/",
                                                                               ".data/"))]
    ignored = (REPO / ".gitignore").read_text().split()
    assert ".airflow/" in ignored and ".data/" in ignored


def test_the_generated_admin_password_lives_only_in_the_airflow_home(tracked):
    """``make up``'s home is .airflow (ignored); a password generated there is in no
    tracked file (checked whenever a local service has generated one)."""
    import os

    from rebalance.ops.service import Settings

    home = Settings().airflow_home
    if not os.environ.get("AIRFLOW_HOME"):
        assert home == (REPO / ".airflow").resolve()
    passwords = []
    for candidate in {home, (REPO / ".airflow").resolve()}:
        f = candidate / PASSWORD_FILE
        if f.exists():
            passwords += [v for v in json.loads(f.read_text()).values() if isinstance(v, str)]
    for password in passwords:
        assert len(password) >= 8
        leaked = [p.relative_to(REPO) for p, t in tracked.items() if password in t]
        assert not leaked, f"the generated admin password is in {leaked}"
