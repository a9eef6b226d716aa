"""Signing and verifying a revision's manifest: AWS KMS in the stacks, a local key file in dev.

Both sign the SHA-256 digest of the manifest's bytes with ECDSA P-256 (KMS `ECDSA_SHA_256` with
`MessageType=DIGEST`, which has no 4 KiB limit on what is signed; locally `cryptography`'s ECDSA
over the prehashed digest), and both signatures are DER, so either verifier can check either. A
verifier checks against the key it was configured with, never a key named by the bucket.

The Pulumi program creates the KMS key (`SIGN_VERIFY`, `ECC_NIST_P256`) and grants the vLLM pods'
model-sync role `kms:Verify` on it and nothing else (infra/components/artifacts.py); whoever
publishes needs `kms:Sign`, from their own credentials.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, utils

from apps.modelsync.manifest import Manifest, ManifestError, canonical

ALGORITHM = "ECDSA_SHA_256"


class Signer(Protocol):
    key_id: str

    def sign(self, digest: bytes) -> bytes:
        """A DER ECDSA signature of the SHA-256 `digest`."""
        ...


class Verifier(Protocol):
    def verify(self, digest: bytes, signature: bytes) -> bool: ...


def digest_of(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def seal(manifest: Manifest, signer: Signer) -> bytes:
    """The `llmfleet-manifest.json` object: the manifest and its signature, one document."""
    return seal_document("manifest", manifest.model_dump(mode="json"), signer)


def unseal(raw: bytes, verifier: Verifier, where: str) -> Manifest:
    """The manifest of a `llmfleet-manifest.json` object, once its signature verifies with the
    verifier's key; else `ManifestError`."""
    return Manifest.parse(unseal_document("manifest", raw, verifier, where), where)


def seal_document(field: str, body: dict[str, Any], signer: Signer) -> bytes:
    """`{field: body, "signature": ...}`: the signature is over `body`'s canonical bytes."""
    signature = signer.sign(digest_of(canonical(body)))
    envelope = {
        field: body,
        "signature": {
            "algorithm": ALGORITHM,
            "key_id": signer.key_id,  # informative: the verifier uses its own configured key
            "value": base64.b64encode(signature).decode(),
        },
    }
    return json.dumps(envelope, sort_keys=True, indent=1).encode() + b"\n"


def unseal_document(field: str, raw: bytes, verifier: Verifier, where: str) -> dict[str, Any]:
    """The `field` of a sealed document once its signature verifies with the verifier's key; else
    `ManifestError`."""
    try:
        envelope = json.loads(raw)
        body, sig = envelope[field], envelope["signature"]
        if not isinstance(body, dict):
            raise ValueError(f"{field} is not an object")
        if sig.get("algorithm") != ALGORITHM:
            raise ValueError(f"algorithm {sig.get('algorithm')!r}")
        signature = base64.b64decode(sig["value"], validate=True)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ManifestError(f"{where}: unreadable {field} or signature ({exc})") from None
    if not verifier.verify(digest_of(canonical(body)), signature):
        raise ManifestError(f"{where}: the {field}'s signature does not verify with the configured key")
    return body


class KmsSigner:
    def __init__(self, client: Any, key_id: str) -> None:
        self._client = client
        self.key_id = key_id

    def sign(self, digest: bytes) -> bytes:
        answer = self._client.sign(
            KeyId=self.key_id, Message=digest, MessageType="DIGEST", SigningAlgorithm=ALGORITHM
        )
        return bytes(answer["Signature"])


class KmsVerifier:
    def __init__(self, client: Any, key_id: str) -> None:
        self._client = client
        self.key_id = key_id

    def verify(self, digest: bytes, signature: bytes) -> bool:
        from botocore.exceptions import ClientError

        try:
            answer = self._client.verify(
                KeyId=self.key_id,
                Message=digest,
                MessageType="DIGEST",
                Signature=signature,
                SigningAlgorithm=ALGORITHM,
            )
        except ClientError as exc:
            # KMS answers a signature that does not verify with this error (moto returns False).
            if exc.response.get("Error", {}).get("Code") == "KMSInvalidSignatureException":
                return False
            raise
        return bool(answer["SignatureValid"])


class LocalSigner:
    """An ECDSA P-256 private key in a PEM file (mode 0600), for dev and tests."""

    def __init__(self, key: ec.EllipticCurvePrivateKey, key_id: str) -> None:
        self._key = key
        self.key_id = key_id

    @classmethod
    def load_or_create(cls, path: Path) -> LocalSigner:
        """Load the key at `path`, or create it (and its public half at `<path>.pub`)."""
        if not path.exists():
            key = ec.generate_private_key(ec.SECP256R1())
            pem = key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(pem)
            public_key_path(path).write_bytes(public_pem(key))
        loaded = serialization.load_pem_private_key(path.read_bytes(), password=None)
        if not isinstance(loaded, ec.EllipticCurvePrivateKey) or not isinstance(loaded.curve, ec.SECP256R1):
            raise ManifestError(f"{path}: not an ECDSA P-256 private key", param="signing_key")
        return cls(loaded, f"local:{path.name}")

    def sign(self, digest: bytes) -> bytes:
        return self._key.sign(digest, ec.ECDSA(utils.Prehashed(hashes.SHA256())))


class LocalVerifier:
    def __init__(self, public_key: ec.EllipticCurvePublicKey) -> None:
        self._key = public_key

    @classmethod
    def load(cls, path: Path) -> LocalVerifier:
        try:
            loaded = serialization.load_pem_public_key(path.read_bytes())
        except (OSError, ValueError) as exc:
            raise ManifestError(f"{path}: cannot read the verify key ({exc})", param="verify_key") from None
        if not isinstance(loaded, ec.EllipticCurvePublicKey):
            raise ManifestError(f"{path}: not an ECDSA public key", param="verify_key")
        return cls(loaded)

    def verify(self, digest: bytes, signature: bytes) -> bool:
        try:
            self._key.verify(signature, digest, ec.ECDSA(utils.Prehashed(hashes.SHA256())))
        except InvalidSignature:
            return False
        return True


def public_key_path(private_key: Path) -> Path:
    return private_key.with_name(private_key.name + ".pub")


def public_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
