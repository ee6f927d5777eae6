"""The secured federation's credentials (``cpcfl_tf/flower/credentials.py``), checked
with the standard library's TLS (OpenSSL) and ``cryptography``'s own loaders, as Flower
loads them: the server certificate makes a TLS handshake with a client that holds only
the CA, for the address asked, and fails one without it; the node keys are P-384 OpenSSH
keys; private keys are 0600; nothing is ever overwritten. The SuperLink and SuperNodes
using them are tested in ``tests/test_flower.py`` (the loopback federation is secured)."""
import os
import socket
import ssl
import stat
import subprocess
import sys
import threading

import pytest

pytest.importorskip("cryptography")

from cpcfl_tf.errors import UserError  # noqa: E402
from cpcfl_tf.flower.credentials import make  # noqa: E402


@pytest.fixture(scope="module")
def creds(tmp_path_factory):
    return make(tmp_path_factory.mktemp("c") / "creds", nodes=2,
                hosts=["127.0.0.1", "server.example.org"])


def _handshake(creds, cafile, server_hostname):
    """A TLS handshake on 127.0.0.1 between a server with the SuperLink's certificate
    and a client that trusts ``cafile`` (None: the system's CAs); the client's error, or
    None."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(creds.server_certificate, creds.server_key)  # key matches
    client = ssl.create_default_context(cafile=str(cafile) if cafile else None)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)

        def serve():
            conn, _ = listener.accept()
            try:
                with server.wrap_socket(conn, server_side=True) as tls:
                    tls.recv(1)
            except (ssl.SSLError, OSError):
                pass

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            with socket.create_connection(listener.getsockname(), timeout=10) as raw, \
                    client.wrap_socket(raw, server_hostname=server_hostname):
                return None
        except ssl.SSLError as err:
            return str(err)
        finally:
            thread.join(timeout=10)


def test_the_superlinks_certificate_is_trusted_through_the_ca_only(creds):
    assert _handshake(creds, creds.ca, "127.0.0.1") is None
    assert _handshake(creds, creds.ca, "server.example.org") is None
    assert "CERTIFICATE_VERIFY_FAILED" in _handshake(creds, None, "127.0.0.1")
    # A name the certificate was not made for is refused, CA or not.
    assert "CERTIFICATE_VERIFY_FAILED" in _handshake(creds, creds.ca, "other.example.org")


def test_node_keys_are_p384_openssh_pairs_and_private_keys_are_0600(creds):
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import (load_ssh_private_key,
                                                              load_ssh_public_key)

    for k in range(2):
        private = load_ssh_private_key(creds.node_key(k).read_bytes(), password=None)
        public = load_ssh_public_key(creds.node_public_key(k).read_bytes())
        assert isinstance(private.curve, ec.SECP384R1) and isinstance(public.curve, ec.SECP384R1)
        assert private.public_key().public_numbers() == public.public_numbers()
    assert creds.node_public_key(0).read_bytes() != creds.node_public_key(1).read_bytes()
    for path in creds.folder.iterdir():
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o600 if path.suffix == ".key" else 0o644), (path.name, oct(mode))


def test_credentials_are_never_overwritten(creds, tmp_path):
    before = {p.name: p.read_bytes() for p in creds.folder.iterdir()}
    with pytest.raises(UserError, match="already holds ca.crt.*give --out a new folder"):
        make(creds.folder, nodes=2)
    assert {p.name: p.read_bytes() for p in creds.folder.iterdir()} == before
    proc = subprocess.run([sys.executable, "-m", "cpcfl_tf.flower.credentials", "--out",
                           str(creds.folder), "--nodes", "3"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert {p.name: p.read_bytes() for p in creds.folder.iterdir()} == before
    with pytest.raises(UserError, match="at least 1"):
        make(tmp_path / "none", nodes=0)
    assert not (tmp_path / "none").exists()


@pytest.mark.parametrize("host,good", [
    ("127.0.0.1", True), ("::1", True), ("fe80::1", True), ("server.example.org", True),
    ("localhost", True), ("a-b.c1.example.", True), ("xn--bcher-kva.example", True),
    ("not a host!", False), ("", False), ("-lead.example", False), ("trail-.example", False),
    ("a..b", False), ("b\u00fccher.example", False), ("x" * 64 + ".example", False),
    (".".join(["a" * 63] * 4) + ".ab", False)])
def test_a_host_is_an_ip_address_or_a_dns_name(host, good, tmp_path):
    """RFC 1123 names and IP addresses only; anything else is refused in one line before
    any file is written."""
    from cpcfl_tf.flower.credentials import host_problem

    assert (host_problem(host) is None) == good, host
    if not good:
        with pytest.raises(UserError, match="neither an IP address nor a DNS name"):
            make(tmp_path / "c", nodes=1, hosts=[host])
        assert not (tmp_path / "c").exists()


def test_the_credentials_command_refuses_a_bad_host_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "cpcfl_tf.flower.credentials", "--out",
                           str(tmp_path / "c"), "--nodes", "2", "--host", "not a host!"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "--host 'not a host!' is neither an IP address nor a DNS name" in proc.stderr
    assert not (tmp_path / "c").exists()


def test_a_first_host_longer_than_a_common_name_is_refused_before_any_file(tmp_path):
    """A valid DNS name of 68 characters cannot be the certificate's common name (at most
    64, RFC 5280): the command refuses it in one line, exit 2, before the folder is made;
    after a short first host it is one more name the certificate is valid for."""
    from cryptography import x509

    from cpcfl_tf.flower.credentials import host_problem

    long_name = "a" * 60 + ".example"
    assert len(long_name) == 68 and host_problem(long_name) is None
    proc = subprocess.run([sys.executable, "-m", "cpcfl_tf.flower.credentials", "--out",
                           str(tmp_path / "c"), "--nodes", "1", "--host", long_name],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "has 68 characters, and the first --host is the certificate's common name, at " \
           "most 64" in proc.stderr
    assert not (tmp_path / "c").exists()
    made = make(tmp_path / "d", nodes=1, hosts=["10.0.0.5", long_name])
    names = x509.load_pem_x509_certificate(made.server_certificate.read_bytes()).extensions \
        .get_extension_for_class(x509.SubjectAlternativeName).value
    assert long_name in names.get_values_for_type(x509.DNSName)


def test_the_launcher_refuses_credentials_it_lacks_before_starting_anything(creds, tmp_path):
    pytest.importorskip("flwr")
    proc = subprocess.run([sys.executable, "-m", "cpcfl_tf.flower.loopback", "--nodes", "3",
                           "--credentials", str(creds.folder), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "lacks node-2.key, node-2.pub" in errors[0], proc.stderr
    assert "python -m cpcfl_tf.flower.credentials --out NEW_DIR --nodes 3" in errors[0]
    assert not (tmp_path / "out").exists()


def test_flower_cannot_bind_or_authenticate_the_control_api_apart():
    """What docs/flower.md tells an operator about Flower 1.42 (so a Flower that can is
    noticed): the Control API's own address is deprecated (one --host/--port serves it),
    and account authentication is not in this distribution."""
    pytest.importorskip("flwr")
    from flwr.superlink.cli.flower_superlink import _parse_args_run_superlink
    from flwr.superlink.config_loader import load_control_authn_plugin

    help_text = " ".join(_parse_args_run_superlink().format_help().split())
    assert ("--control-api-address CONTROL_API_ADDRESS Deprecated. The Control API now "
            "operates over HTTP. Use `--host` and `--port` instead." in help_text)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FLWR_OIDC_ENABLED", "1")
        with pytest.raises(SystemExit, match="OIDC account authentication is unavailable in "
                                             "this Flower distribution"):
            load_control_authn_plugin()
