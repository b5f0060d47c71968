"""librdkafka's connection settings as the Java Kafka client (Spark's Kafka source) names them.

A ``Cluster`` holds librdkafka settings; most mean the same under the same name in Java
(``security.protocol``, ``sasl.mechanism``, ``socket.timeout.ms``...). Those that differ are
the ones a secured cluster needs:

- ``sasl.username``/``sasl.password`` become a ``sasl.jaas.config`` line (``PlainLoginModule``
  or ``ScramLoginModule``); Java has no such settings, so they are not passed on.
- ``ssl.ca.location`` (a PEM file) becomes ``ssl.truststore.type=PEM`` and
  ``ssl.truststore.location`` (Kafka 2.7 and later read PEM trust stores).
- A client certificate (``ssl.certificate.location`` and ``ssl.key.location``) becomes a PEM
  key store: ``ssl.keystore.type=PEM`` with ``ssl.keystore.location`` when both name one file
  holding the key and the chain. Java reads a PEM key store from one file only, so separate
  files are refused with a ``ValueError`` that says how to join them.
- ``ssl.endpoint.identification.algorithm=none`` is Java's empty value.
- ``sasl.mechanisms`` (librdkafka's alias) is ``sasl.mechanism``.

A setting the caller gave by its Java name (``sasl.jaas.config``, ``ssl.truststore.*``) is
kept as given and wins over the mapping. File paths are passed as paths: on a Spark cluster
they must exist on every executor, as the connector's own documentation says of key stores.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["jaas_config", "java_client_settings", "librdkafka_settings"]

_SASL_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}

#: librdkafka settings that have no Java counterpart by that name: mapped below, not passed.
_MAPPED = frozenset(
    {"sasl.mechanisms", "ssl.ca.location", "ssl.certificate.location", "ssl.key.location"}
)
#: A JAAS line's user and password, as ``jaas_config`` writes them.
_JAAS = re.compile(
    r'^\s*(?P<module>[\w.]+)\s+required\s+username="(?P<user>(?:[^"\\]|\\.)*)"\s+'
    r'password="(?P<password>(?:[^"\\]|\\.)*)"\s*;\s*$'
)


def _quoted(value: object) -> str:
    """A JAAS option value: quoted, with Java's escapes for quotes and backslashes."""
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def jaas_config(settings: Mapping[str, Any]) -> str | None:
    """A ``sasl.jaas.config`` for Java clients from librdkafka's username/password pair, or
    ``None`` without a pair or for a mechanism other than PLAIN and SCRAM."""
    user, password = settings.get("sasl.username"), settings.get("sasl.password")
    mechanism = settings.get("sasl.mechanism", settings.get("sasl.mechanisms", "PLAIN"))
    module = _SASL_MODULES.get(str(mechanism).upper())
    if user is None or password is None or module is None:
        return None
    return f"{module} required username={_quoted(user)} password={_quoted(password)};"


def _keystore(settings: Mapping[str, Any]) -> dict[str, str]:
    cert, key = settings.get("ssl.certificate.location"), settings.get("ssl.key.location")
    if cert is None and key is None:
        return {}
    if cert is None or key is None or str(cert) != str(key):
        raise ValueError(
            "Spark's Kafka source (a Java client) reads a client certificate from one PEM file "
            "holding the private key (PKCS#8) and the certificate chain: join them "
            "(cat key.pem cert.pem > client.pem) and set ssl.certificate.location and "
            "ssl.key.location both to it, or give the Java settings ssl.keystore.type=PEM and "
            f"ssl.keystore.location yourself (got ssl.certificate.location={cert!r}, "
            f"ssl.key.location={key!r})"
        )
    return {"ssl.keystore.type": "PEM", "ssl.keystore.location": str(cert)}


def java_client_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` (librdkafka's names) as the Java Kafka client's settings.

    Raises:
        ValueError: A client certificate and its key in two files (Java needs one).
    """
    out: dict[str, Any] = {k: v for k, v in settings.items() if k not in _MAPPED}
    jaas = jaas_config(settings)
    if jaas is not None:
        out.setdefault("sasl.jaas.config", jaas)
        del out["sasl.username"], out["sasl.password"]  # Java has no such settings
    mechanism = settings.get("sasl.mechanisms")
    if mechanism is not None:
        out.setdefault("sasl.mechanism", mechanism)
    protocol = out.get("security.protocol")
    if isinstance(protocol, str):
        out["security.protocol"] = protocol.upper()
    if str(out.get("ssl.endpoint.identification.algorithm", "")).lower() == "none":
        out["ssl.endpoint.identification.algorithm"] = ""
    ca = settings.get("ssl.ca.location")
    if ca is not None and "ssl.truststore.location" not in settings:
        out.update({"ssl.truststore.type": "PEM", "ssl.truststore.location": str(ca)})
    if not {"ssl.keystore.location", "ssl.keystore.key"} & set(settings):
        out.update(_keystore(settings))
    return out


def _unquoted(value: str) -> str:
    return re.sub(r"\\(.)", r"\1", value)


def librdkafka_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of ``java_client_settings``, for ``format("bolide")``, whose workers run
    librdkafka but take the options of Spark's Kafka source: a PLAIN or SCRAM JAAS line
    becomes ``sasl.username``/``sasl.password``, a PEM trust store ``ssl.ca.location``, a PEM
    key store file ``ssl.certificate.location`` and ``ssl.key.location``. Java settings
    librdkafka does not know are dropped once mapped.

    Raises:
        ValueError: A ``sasl.jaas.config`` other than a PLAIN or SCRAM user and password (set
            librdkafka's own settings for it instead).
    """
    out = dict(settings)
    jaas = out.pop("sasl.jaas.config", None)
    if jaas is not None:
        found = _JAAS.match(str(jaas))
        if found is None or found["module"] not in _SASL_MODULES.values():
            raise ValueError(
                "kafka.sasl.jaas.config: format('bolide') reads only a PlainLoginModule or "
                "ScramLoginModule line with username and password; give librdkafka's settings "
                "(kafka.sasl.username, kafka.sasl.password...) instead"
            )
        out.setdefault("sasl.username", _unquoted(found["user"]))
        out.setdefault("sasl.password", _unquoted(found["password"]))
    if str(out.get("ssl.truststore.type", "")).upper() == "PEM":
        del out["ssl.truststore.type"]
        trust = out.pop("ssl.truststore.location", None)
        if trust is not None:
            out.setdefault("ssl.ca.location", trust)
    if str(out.get("ssl.keystore.type", "")).upper() == "PEM":
        del out["ssl.keystore.type"]
        keys = out.pop("ssl.keystore.location", None)
        if keys is not None:
            out.setdefault("ssl.certificate.location", keys)
            out.setdefault("ssl.key.location", keys)
    if out.get("ssl.endpoint.identification.algorithm") == "":
        out["ssl.endpoint.identification.algorithm"] = "none"
    return out
