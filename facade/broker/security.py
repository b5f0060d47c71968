"""A secured embedded Apache Kafka: TLS from a CA of its own, SASL users, an authorizer.

``EmbeddedBroker(engine="kafka", security=...)`` runs its client listener as ``"ssl"``
(mutual TLS: a user is a client certificate), ``"sasl_plaintext"`` or ``"sasl_ssl"``
(SCRAM-SHA-512 users, and PLAIN for the super user), with Kafka's ``StandardAuthorizer`` and
``allow.everyone.if.no.acl.found=false``: what a locked-down production cluster does, so that
ACLs are tested as they are run.

The certificates are PEM files made with the ``openssl`` command (on Linux and macOS by
default; it is the only tool used, since Java's keytool cannot write a private key as PEM,
which librdkafka needs) in the broker's folder: ``ca.pem`` is the CA every client trusts.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Literal

from bolide.facade.errors import BrokerError

__all__ = ["SECURITY", "SUPER_USER", "BrokerSecurity", "SecurityName", "check_security"]

SecurityName = Literal["plaintext", "sasl_plaintext", "sasl_ssl", "ssl"]

#: The ``security`` values ``EmbeddedBroker`` accepts.
SECURITY: tuple[str, ...] = ("plaintext", "sasl_plaintext", "sasl_ssl", "ssl")

#: The super user every secured embedded broker has (its brokers speak as it too).
SUPER_USER = "admin"

#: The SASL mechanism of users made with ``add_user``.
SCRAM = "SCRAM-SHA-512"

_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
_DAYS = "3650"


def check_security(security: str) -> str:
    """``security`` when it is one of ``SECURITY``.

    Raises:
        ValueError: Any other value.
    """
    if security not in SECURITY:
        raise ValueError(f"security must be one of {', '.join(SECURITY)}, got {security!r}")
    return security


def _openssl(*args: str, cwd: Path) -> None:
    tool = shutil.which("openssl")
    if tool is None:
        raise BrokerError(
            "a secured embedded broker makes its certificates with the openssl command, which "
            "is not on PATH (install OpenSSL, or use security='plaintext' or 'sasl_plaintext')"
        )
    done = subprocess.run(
        [tool, *args], cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    if done.returncode != 0:
        raise BrokerError(f"openssl {args[0]} failed: {done.stderr.strip()[-500:]}")


class BrokerSecurity:
    """The listener settings, certificates and super user of one secured embedded broker.

    Args:
        mode: One of ``SECURITY`` other than ``"plaintext"``.
        folder: Where the PEM files go (the broker's own folder, removed when it stops).
        host: The address clients reach the broker at (in its certificate).
    """

    def __init__(self, mode: str, folder: Path, host: str) -> None:
        self.mode = check_security(mode)
        self.folder = folder
        self.host = host
        self.password = secrets.token_hex(16)
        self.tls = mode in ("ssl", "sasl_ssl")
        self.sasl = mode.startswith("sasl")
        self._admin: dict[str, str] = {}

    @property
    def ca_location(self) -> Path:
        """The CA certificate (PEM) that signed the broker's and users' certificates."""
        return self.folder / "ca.pem"

    @property
    def protocol(self) -> str:
        """The client listener's ``security.protocol``."""
        return self.mode.upper()

    def generate(self) -> None:
        """Make the CA, the broker's certificate and (mutual TLS) the super user's."""
        if not self.tls or self.ca_location.exists():
            return
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        _openssl(
            *("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"),
            *("-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", _DAYS),
            *("-subj", "/CN=bolide embedded broker CA"),
            *("-addext", "basicConstraints=critical,CA:TRUE"),
            *("-addext", "keyUsage=critical,keyCertSign,cRLSign"),
            cwd=self.folder,
        )
        # The broker's certificate is the super user's too: brokers talk to each other as it.
        self._sign("broker", SUPER_USER, f"subjectAltName=IP:{self.host},DNS:localhost")
        self._key_and_certificate("broker", "broker-keystore.pem")
        if self.mode == "ssl":
            self._admin = self.client_certificate(SUPER_USER)

    def _sign(self, stem: str, common_name: str, extensions: str = "") -> None:
        ext = self.folder / f"{stem}.ext"
        ext.write_text(f"extendedKeyUsage=serverAuth,clientAuth\n{extensions}\n")
        _openssl(
            *("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"),
            *("-nodes", "-keyout", f"{stem}.key", "-out", f"{stem}.csr"),
            *("-subj", f"/CN={common_name}"),
            cwd=self.folder,
        )
        _openssl(
            *("x509", "-req", "-in", f"{stem}.csr", "-CA", "ca.pem", "-CAkey", "ca.key"),
            *("-set_serial", str(secrets.randbits(63)), "-days", _DAYS),
            *("-out", f"{stem}.pem", "-extfile", ext.name),
            cwd=self.folder,
        )

    def _key_and_certificate(self, stem: str, name: str) -> Path:
        """``stem``'s key and certificate in one PEM file, ``name``: a Java PEM key store."""
        joined = self.folder / name
        key, cert = (self.folder / f"{stem}.key"), (self.folder / f"{stem}.pem")
        joined.write_text(key.read_text() + cert.read_text())
        joined.chmod(0o600)
        return joined

    def client_certificate(self, user: str) -> dict[str, str]:
        """A client certificate for ``user`` (its common name, which the broker takes as the
        principal ``User:<user>``), signed by the broker's CA.

        Returns:
            The librdkafka settings that present it: ``ssl.certificate.location`` and
            ``ssl.key.location``, both naming one PEM file that holds the key (PKCS#8) and
            the certificate, the one file a Java client's PEM key store reads (Spark's
            Kafka source: ``bolide.spark.kafka_options``).
        """
        if not self.tls:
            raise BrokerError(f"a {self.mode} broker has no TLS: client certificates need 'ssl'")
        if not user or any(c in user for c in '/,=+"\\<>;#\n'):
            raise ValueError(f"a user name for a certificate must be plain text, got {user!r}")
        stem = f"user-{secrets.token_hex(4)}"
        self._sign(stem, user)
        both = self._key_and_certificate(stem, f"{stem}-key-and-certificate.pem")
        return {"ssl.certificate.location": str(both), "ssl.key.location": str(both)}

    def listener_properties(self, listener: str) -> dict[str, str]:
        """``server.properties`` entries of the client listener ``listener`` (also the
        inter-broker one), the controller's SASL and the authorizer."""
        name = listener.lower()
        plain = (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="{SUPER_USER}" password="{self.password}" '
            f'user_{SUPER_USER}="{self.password}";'
        )
        props = {
            "authorizer.class.name": _AUTHORIZER,
            "super.users": f"User:{SUPER_USER}",
            "allow.everyone.if.no.acl.found": "false",
            # The controller listener (loopback, between nodes) takes the super user over PLAIN.
            "sasl.mechanism.controller.protocol": "PLAIN",
            "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
            "listener.name.controller.plain.sasl.jaas.config": plain,
        }
        if self.sasl:
            props.update(
                {
                    "sasl.enabled.mechanisms": f"{SCRAM},PLAIN",
                    "sasl.mechanism.inter.broker.protocol": "PLAIN",
                    f"listener.name.{name}.plain.sasl.jaas.config": plain,
                    f"listener.name.{name}.{SCRAM.lower()}.sasl.jaas.config": (
                        "org.apache.kafka.common.security.scram.ScramLoginModule required;"
                    ),
                }
            )
        if self.tls:
            props.update(
                {
                    "ssl.keystore.type": "PEM",
                    "ssl.keystore.location": str(self.folder / "broker-keystore.pem"),
                    "ssl.truststore.type": "PEM",
                    "ssl.truststore.location": str(self.ca_location),
                }
            )
        if self.mode == "ssl":
            props.update(
                {
                    "ssl.client.auth": "required",
                    # A certificate's principal is its common name: User:alice, not User:CN=...
                    "ssl.principal.mapping.rules": "RULE:^CN=([^,]+)$/$1/,DEFAULT",
                }
            )
        return props

    def format_arguments(self) -> list[str]:
        """``StorageTool format`` arguments that give the super user SCRAM credentials."""
        if not self.sasl:
            return []
        return ["--add-scram", f"{SCRAM}=[name={SUPER_USER},password={self.password}]"]

    def client_settings(self) -> dict[str, Any]:
        """librdkafka settings of the super user."""
        settings: dict[str, Any] = {"security.protocol": self.protocol}
        if self.tls:
            settings["ssl.ca.location"] = str(self.ca_location)
        if self.sasl:
            settings.update(
                {
                    "sasl.mechanism": SCRAM,
                    "sasl.username": SUPER_USER,
                    "sasl.password": self.password,
                }
            )
        settings.update(self._admin)
        return settings

    def add_scram_user(
        self, bootstrap: str, user: str, password: str, timeout_s: float = 30.0
    ) -> None:
        """Give ``user`` SCRAM-SHA-512 credentials (as the super user, through
        ``AdminClient.alter_user_scram_credentials``) and wait until the broker knows them."""
        from confluent_kafka.admin import (
            AdminClient,
            ScramCredentialInfo,
            ScramMechanism,
            UserScramCredentialUpsertion,
        )

        if not self.sasl:
            raise BrokerError(f"a {self.mode} broker has no SASL users: use client_certificate")
        admin = AdminClient({"bootstrap.servers": bootstrap, **self.client_settings()})
        info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192)
        upsert = UserScramCredentialUpsertion(user, info, password.encode())
        for future in admin.alter_user_scram_credentials([upsert]).values():
            future.result(timeout_s)
        deadline = time.monotonic() + timeout_s
        last: object = "not listed"
        while time.monotonic() < deadline:  # credentials reach the brokers through metadata
            try:
                futures = admin.describe_user_scram_credentials([user])
                assert isinstance(futures, dict)  # a dict of futures when users are named
                if futures[user].result(timeout_s) is not None:
                    return
            except Exception as exc:
                last = exc
            time.sleep(0.1)
        raise BrokerError(f"the broker did not list SCRAM credentials of {user!r}: {last}")
