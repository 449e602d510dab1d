"""The admin user's password, written by docker-compose.yaml's airflow-init for the API server.

Airflow's simple auth manager reads `{user: password}` from AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE,
on the config volume that the Airflow services share. The password is, in this order:
_AIRFLOW_WWW_USER_PASSWORD when it is set; the one the file already holds for the user; a new
random one, printed once here for the person starting the stack (as `airflow standalone` does).
The file is readable by its owner only: airflow-init runs as root, then hands the config volume to
AIRFLOW_UID.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from pathlib import Path

USER_VARIABLE = "_AIRFLOW_WWW_USER_USERNAME"
PASSWORD_VARIABLE = "_AIRFLOW_WWW_USER_PASSWORD"
FILE_VARIABLE = "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"


def read_passwords(path: Path) -> dict[str, str]:
    try:
        passwords = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return passwords if isinstance(passwords, dict) else {}


def write_passwords(path: Path, passwords: dict[str, str]) -> None:
    """Replace the file, created readable and writable by its owner only."""
    temporary = path.with_name(f".{path.name}.new")
    temporary.unlink(missing_ok=True)
    with os.fdopen(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as stream:
        json.dump(passwords, stream)
    temporary.replace(path)


def choose_password(existing: str | None, given: str = "") -> tuple[str, str]:
    """(password, where it comes from: 'given', 'kept' or 'generated')."""
    if given:
        return given, "given"
    if existing:
        return existing, "kept"
    return secrets.token_urlsafe(18), "generated"


def main() -> int:
    user = os.environ.get(USER_VARIABLE) or "airflow"
    path = Path(os.environ[FILE_VARIABLE])
    password, origin = choose_password(read_passwords(path).get(user), os.environ.get(PASSWORD_VARIABLE, ""))
    write_passwords(path, {user: password})
    if origin == "generated":
        print(f"Admin user {user!r}, generated password: {password}")
    elif origin == "given":
        print(f"Admin user {user!r}: the password set in {PASSWORD_VARIABLE}")
    else:
        print(f"Admin user {user!r}: the password generated at the first start")
    print(f"The password stays in {path}: docker compose exec airflow-apiserver cat {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
