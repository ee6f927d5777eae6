"""The certificates and keys of a secured federation, made with ``cryptography`` (the
library Flower itself loads them with):

- ``ca.crt`` / ``ca.key``: a certificate authority, made here, that signs the SuperLink's
  certificate; every SuperNode and every ``flwr`` CLI gets ``ca.crt`` to check whom it
  talks to (``--root-certificates``, ``root-certificates`` in the connection);
- ``server.pem`` / ``server.key``: the SuperLink's TLS certificate, valid for the names
  and addresses given (``--host``), signed by the CA (``--ssl-certfile``,
  ``--ssl-keyfile``, with ``--ssl-ca-certfile ca.crt``);
- ``node-K.key`` / ``node-K.pub``: each SuperNode's key pair for SuperNode
  authentication, ECDSA on NIST P-384 in OpenSSH format, as Flower's
  ``flwr supernode register`` and ``flower-supernode --auth-supernode-private-key`` read
  them. Only nodes whose public key is registered with a SuperLink started with
  ``--enable-supernode-auth`` may join it.

Private keys are written 0600 and nothing is ever overwritten; keep them out of any
repository (``.gitignore`` lists the file names). docs/flower.md's "A secured federation"
gives the commands that use them.

    python -m cpcfl_tf.flower.credentials --out creds --nodes 3 --host server.example.org
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import os
import re
from collections.abc import Sequence
from pathlib import Path

from cpcfl_tf.errors import UserError

CURVE = "secp384r1"
"""NIST P-384: the curve Flower's docs generate SuperNode keys on (any NIST curve is
accepted by ``flwr supernode register``); the CA and server keys use it too."""

DAYS = 365
"""How long the certificates are valid."""


@dataclasses.dataclass(frozen=True)
class Credentials:
    """Where one federation's files are (see the module's docstring)."""

    folder: Path

    @property
    def ca(self) -> Path:
        return self.folder / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.folder / "ca.key"

    @property
    def server_certificate(self) -> Path:
        return self.folder / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.folder / "server.key"

    def node_key(self, k: int) -> Path:
        return self.folder / f"node-{k}.key"

    def node_public_key(self, k: int) -> Path:
        return self.folder / f"node-{k}.pub"

    def files(self, nodes: int, *, signing: bool = False) -> list[Path]:
        """What a federation of ``nodes`` SuperNodes needs: the CA, the SuperLink's
        certificate and key, each node's key pair; with ``signing``, also the CA's key
        (which only the one who makes certificates needs)."""
        return [
            self.ca,
            *([self.ca_key] if signing else []),
            self.server_certificate,
            self.server_key,
            *(p for k in range(nodes) for p in (self.node_key(k), self.node_public_key(k))),
        ]

    def superlink_flags(self) -> list[str]:
        """``flower-superlink``'s TLS flags and SuperNode authentication."""
        return [
            "--ssl-ca-certfile",
            _full(self.ca),
            "--ssl-certfile",
            _full(self.server_certificate),
            "--ssl-keyfile",
            _full(self.server_key),
            "--enable-supernode-auth",
        ]

    def supernode_flags(self, k: int, *, ca: bool = True) -> list[str]:
        """``flower-supernode``'s flags for node ``k``: the CA that checks the SuperLink
        (left out with ``ca=False``: the node then trusts only the system's CAs) and the
        node's private key."""
        return [
            *(["--root-certificates", _full(self.ca)] if ca else []),
            "--auth-supernode-private-key",
            _full(self.node_key(k)),
        ]


def _full(path: Path) -> str:
    return str(path.resolve())


def _ec_key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(getattr(ec, CURVE.upper())())


def _name(common_name: str):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


COMMON_NAME_LIMIT = 64
"""The longest common name a certificate may hold (RFC 5280's ub-common-name); the other
names it is valid for (subject alternative names) may be longer."""

_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def host_problem(host: str) -> str | None:
    """What keeps ``host`` from being a name a client can check the SuperLink's
    certificate against: an IP address (v4 or v6) or a DNS name (RFC 1123: dot-separated
    labels of 1-63 letters, digits and inner hyphens, 253 characters at most; ASCII, so
    an international name in its xn-- form). None: it is one."""
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    name = host[:-1] if host.endswith(".") else host
    if not name or len(name) > 253 or not all(_LABEL.fullmatch(label) for label in name.split(".")):
        return (
            f"--host {host!r} is neither an IP address nor a DNS name (letters, digits, "
            "inner hyphens and dots; an international name in its xn-- form)"
        )
    return None


def _alternative_names(hosts: Sequence[str]):
    from cryptography import x509

    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def _certificate(
    subject: str, key, issuer: str, issuer_key, *, ca: bool, hosts: Sequence[str] = ()
):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID

    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=DAYS))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    else:
        builder = builder.add_extension(_alternative_names(hosts), critical=False).add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA384())


def _write(path: Path, data: bytes, private: bool) -> None:
    # O_EXCL: never overwrite; a private key is 0600 from its first byte.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def make(folder: str | Path, nodes: int, hosts: Sequence[str] = ("127.0.0.1",)) -> Credentials:
    """Write a CA, the SuperLink's certificate for ``hosts`` and ``nodes`` SuperNode key
    pairs into ``folder`` (made if missing). Refuses, before writing anything, a folder
    that already holds any of these files, a node count below 1, no host, a host that
    is neither an IP address nor a DNS name (:func:`host_problem`) and a first host (the
    certificate's common name) longer than :data:`COMMON_NAME_LIMIT`."""
    from cryptography.hazmat.primitives import serialization as s

    creds = Credentials(Path(folder))
    if nodes < 1:
        raise UserError(f"--nodes {nodes}: give at least 1 SuperNode")
    if not hosts:
        raise UserError("give the SuperLink's address with --host (a name or an IP address)")
    for host in hosts:
        problem = host_problem(host)
        if problem is not None:
            raise UserError(f"{problem}: give the name or address the nodes reach the SuperLink at")
    if len(hosts[0]) > COMMON_NAME_LIMIT:
        raise UserError(
            f"--host {hosts[0]!r} has {len(hosts[0])} characters, and the first "
            f"--host is the certificate's common name, at most {COMMON_NAME_LIMIT} "
            "(RFC 5280): give a shorter name or an IP address first, the long "
            "name after it (e.g. --host 10.0.0.5 --host LONG.NAME)"
        )
    present = [p.name for p in creds.files(nodes, signing=True) if p.exists()]
    if present:
        raise UserError(
            f"{creds.folder} already holds {', '.join(present)}: give --out a "
            "new folder (credentials are never overwritten)"
        )
    creds.folder.mkdir(parents=True, exist_ok=True)
    pem, pkcs8 = s.Encoding.PEM, s.PrivateFormat.PKCS8
    ca_key, server_key = _ec_key(), _ec_key()
    ca = _certificate("cpcfl_tf federation CA", ca_key, "cpcfl_tf federation CA", ca_key, ca=True)
    server = _certificate(
        hosts[0], server_key, "cpcfl_tf federation CA", ca_key, ca=False, hosts=hosts
    )
    _write(creds.ca, ca.public_bytes(pem), private=False)
    _write(creds.ca_key, ca_key.private_bytes(pem, pkcs8, s.NoEncryption()), private=True)
    _write(creds.server_certificate, server.public_bytes(pem), private=False)
    _write(creds.server_key, server_key.private_bytes(pem, pkcs8, s.NoEncryption()), private=True)
    for k in range(nodes):
        key = _ec_key()
        _write(
            creds.node_key(k),
            key.private_bytes(pem, s.PrivateFormat.OpenSSH, s.NoEncryption()),
            private=True,
        )
        _write(
            creds.node_public_key(k),
            key.public_key().public_bytes(s.Encoding.OpenSSH, s.PublicFormat.OpenSSH) + b"\n",
            private=False,
        )
    return creds


def main(argv: Sequence[str] | None = None) -> None:
    from cpcfl_tf.errors import ArgumentParser

    parser = ArgumentParser(
        prog="python -m cpcfl_tf.flower.credentials",
        description="Make the TLS certificates and SuperNode keys of a "
        "secured Flower federation (never overwrites).",
    )
    parser.add_argument("--out", type=Path, required=True, help="a new folder for the files")
    parser.add_argument("--nodes", type=int, required=True, help="SuperNode key pairs to make")
    parser.add_argument(
        "--host",
        action="append",
        default=[],
        metavar="NAME_OR_IP",
        help="a name or address the SuperLink is reached at (repeatable; default 127.0.0.1)",
    )
    args = parser.parse_args(argv)
    creds = make(args.out, args.nodes, args.host or ["127.0.0.1"])
    print(
        f"wrote {creds.ca.name}, ca.key, {creds.server_certificate.name}, "
        f"{creds.server_key.name} and node-0..{args.nodes - 1}.key/.pub in {creds.folder}; "
        "private keys (*.key) are 0600: keep them off any repository"
    )


if __name__ == "__main__":
    from cpcfl_tf.errors import run_cli

    run_cli(main)
