"""The local broker's ACL mode: principals, their passwords, and the ACLs that say who
may write what (docs/security.md).

Kafka enforces it: a SASL listener names every client's principal and the
``StandardAuthorizer`` (KRaft) refuses whatever no ACL allows. The principals:

* ``memstream-admin``: the broker's own identity (inter-broker and controller) and the
  only super user; used for nothing but this setup.
* ``memstream-worker``: the worker and operator commands: everything under the topic
  prefix and the app id (events, keys, the reflector's topics, faust's changelogs), the
  app's consumer groups and transactional ids.
* ``memstream-producer``: producers and the API: write the ingress topic only (and see
  the kept-forever topics' offsets, which the API's read-your-writes checks use).
* ``memstream-reader``: reads the kept-forever topics, which hold sealed records only.

Passwords are generated once per home into ``<home>/kafka/<principal>.password``
(``LocalBrokerConfig.credentials_dir``)
(directory 0700, files 0600). The mechanism is PLAIN (the users live in the broker's
JAAS configuration, in ``server.properties``, 0600), so a home formatted before ACL mode
needs no re-format. The ACLs are created with Kafka's own ``AclCommand`` as the admin,
after the broker answers, and only when the wanted set changed since the last start.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from memstream.settings import LOCAL_WORKER_PRINCIPAL, BrokerSettings, LocalBrokerConfig
from memstream.streams.broker.logs import last_lines
from memstream.streams.broker.paths import BrokerError, BrokerPaths
from memstream.streams.topics import Topics

__all__ = [
    "ADMIN",
    "WORKER",
    "PRODUCER",
    "READER",
    "PRINCIPALS",
    "AclRule",
    "acl_rules",
    "password_file",
    "ensure_credentials",
    "read_password",
    "sasl_properties",
    "apply_acls",
    "forget_acls",
]

ADMIN = "memstream-admin"
WORKER = LOCAL_WORKER_PRINCIPAL
PRODUCER = "memstream-producer"
READER = "memstream-reader"
PRINCIPALS = (ADMIN, WORKER, PRODUCER, READER)
_PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"


def password_file(credentials_dir: Path, principal: str) -> Path:
    return credentials_dir / f"{principal}.password"


def read_password(credentials_dir: Path, principal: str) -> str:
    try:
        return password_file(credentials_dir, principal).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise BrokerError(f"no password for {principal} in {credentials_dir}: {exc.strerror}") from None


def _write_private(path: Path, text: str) -> None:
    """Create ``path`` with mode 0600 from the start (never briefly readable)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(path, 0o600)


def ensure_credentials(folder: Path) -> dict[str, str]:
    """Every principal's password in ``folder``, generated on first use (256 random bits each)."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    passwords = {}
    for principal in PRINCIPALS:
        path = password_file(folder, principal)
        if not path.is_file() or not path.read_text(encoding="utf-8").strip():
            _write_private(path, secrets.token_urlsafe(32) + "\n")
        passwords[principal] = path.read_text(encoding="utf-8").strip()
    return passwords


def _jaas(passwords: dict[str, str]) -> str:
    """The listener's PLAIN login: the broker logs in as the admin, and the users it
    accepts are listed as ``user_<name>``."""
    users = " ".join(f'user_{name}="{pw}"' for name, pw in passwords.items())
    return f'{_PLAIN_MODULE} required username="{ADMIN}" password="{passwords[ADMIN]}" {users};'


def sasl_properties(passwords: dict[str, str]) -> dict[str, str]:
    """``server.properties`` entries of ACL mode (merged over the plain ones): SASL on
    the client and the controller listener, the authorizer, the admin as super user."""
    jaas = _jaas(passwords)
    return {
        "sasl.enabled.mechanisms": "PLAIN",
        "sasl.mechanism.inter.broker.protocol": "PLAIN",
        "sasl.mechanism.controller.protocol": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": jaas,
        "listener.name.controller.plain.sasl.jaas.config": jaas,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": f"User:{ADMIN}",
        "allow.everyone.if.no.acl.found": "false",
    }


@dataclass(frozen=True)
class AclRule:
    """One ``AclCommand --add``: every principal gets every operation on every resource."""

    principals: tuple[str, ...]
    operations: tuple[str, ...]
    pattern: str  # LITERAL or PREFIXED
    topics: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    transactional_ids: tuple[str, ...] = ()
    cluster: bool = False

    def arguments(self) -> list[str]:
        args = ["--add", "--resource-pattern-type", self.pattern.lower()]
        args += [a for p in self.principals for a in ("--allow-principal", f"User:{p}")]
        args += [a for op in self.operations for a in ("--operation", op)]
        args += [a for t in self.topics for a in ("--topic", t)]
        args += [a for g in self.groups for a in ("--group", g)]
        args += [a for t in self.transactional_ids for a in ("--transactional-id", t)]
        return args + (["--cluster"] if self.cluster else [])


def acl_rules(broker: BrokerSettings, app_id: str) -> list[AclRule]:
    """The ACL set of one deployment (docs/security.md lists the same for a managed
    cluster). Readers get the kept-forever topics only: ingress and dead letters hold
    plaintext."""
    topics = Topics.from_settings(broker)
    prefixes = tuple(dict.fromkeys((broker.topic_prefix, app_id)))
    sealed = tuple(topics.kept_forever())
    return [
        AclRule((WORKER,), ("All",), "PREFIXED", topics=prefixes, groups=(app_id,), transactional_ids=(app_id,)),
        AclRule((WORKER, PRODUCER), ("IdempotentWrite",), "LITERAL", cluster=True),
        AclRule((PRODUCER,), ("Write", "Describe"), "LITERAL", topics=(topics.ingress,)),
        AclRule((PRODUCER,), ("Describe",), "LITERAL", topics=(*sealed, topics.dead_letter)),
        AclRule((READER,), ("Read", "Describe"), "LITERAL", topics=sealed),
    ]


def _fingerprint(rules: Sequence[AclRule], port: int) -> str:
    text = json.dumps([r.arguments() for r in rules] + [port])
    return hashlib.sha256(text.encode()).hexdigest()


def _admin_config(credentials_dir: Path, paths: BrokerPaths) -> Path:
    path = paths.root / "admin-client.properties"
    jaas = f'{_PLAIN_MODULE} required username="{ADMIN}" password="{read_password(credentials_dir, ADMIN)}";'
    _write_private(path, f"security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.jaas.config={jaas}\n")
    return path


def _marker(paths: BrokerPaths) -> Path:
    return paths.root / "acls.json"


def forget_acls(paths: BrokerPaths) -> None:
    """Drop the record of created ACLs (storage is about to be formatted afresh)."""
    _marker(paths).unlink(missing_ok=True)


def apply_acls(java: str, libs: Path, config: LocalBrokerConfig, paths: BrokerPaths, jvm: Sequence[str]) -> bool:
    """Create the ACL set with ``AclCommand`` (adding an existing ACL is a no-op), one
    JVM per rule, side by side. Skipped when this broker already got this very set
    (``acls.json``); returns whether it ran."""
    rules = acl_rules(config.broker, config.app_id)
    marker = _marker(paths)
    wanted = _fingerprint(rules, config.broker.port)
    try:
        if json.loads(marker.read_text()).get("fingerprint") == wanted:
            return False
    except (OSError, ValueError, AttributeError):
        pass
    admin_config = _admin_config(config.credentials_dir, paths)
    base = [java, *jvm, "-cp", str(libs / "*"), "org.apache.kafka.tools.AclCommand",
            "--bootstrap-server", f"127.0.0.1:{config.broker.port}", "--command-config", str(admin_config)]

    def run(rule: AclRule) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*base, *rule.arguments()], stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=120, check=False)

    with ThreadPoolExecutor(max_workers=len(rules)) as pool:
        done = list(pool.map(run, rules))
    failed = [(rule, d) for rule, d in zip(rules, done) if d.returncode != 0]
    if failed:
        rule, d = failed[0]
        raise BrokerError(
            f"creating the ACLs failed ({len(failed)} of {len(rules)} AclCommand runs; first: "
            f"{' '.join(rule.arguments())})\n{last_lines(d.stdout + d.stderr, 20)}"
        )
    marker.write_text(json.dumps({"fingerprint": wanted, "rules": [r.arguments() for r in rules]}, indent=1))
    return True
