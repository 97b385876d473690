"""Records the service signs and its handlers verify: what a record says cannot be changed by
whoever can write where it is kept (a job's target in the tile index, a tile's leave to be
ingested in the tile bucket's metadata). HMAC-SHA256 under a key derived from the service's
secret (NDSTORE_SECRET_KEY) for one purpose, so a signature made for one use is worth nothing
in another."""

from __future__ import annotations

import hashlib
import hmac

from ndstore.core.errors import NDStoreError

MIN_SECRET = 16


class BadSignature(NDStoreError):
    """A record that claims to come from the service does not (tampered with, or forged)."""


class Signer:
    def __init__(self, secret: str, purpose: str):
        if len(secret) < MIN_SECRET:
            raise ValueError(f"NDSTORE_SECRET_KEY must be set to at least {MIN_SECRET} characters: the service "
                             "signs the records its handlers trust with it")
        self._key = hmac.new(secret.encode(), f"ndstore:{purpose}".encode(), hashlib.sha256).digest()

    def sign(self, *parts: str) -> str:
        message = "\x00".join(parts).encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def verify(self, signature: str, *parts: str) -> bool:
        return hmac.compare_digest(signature.encode(), self.sign(*parts).encode())

    def seal(self, name: str, text: str) -> str:
        """`text`, stored under `name`, with a signature over both: moved to another name or
        changed, it no longer opens."""
        return f"{self.sign(name, text)} {text}"

    def open(self, name: str, sealed: str) -> str:
        signature, _, text = sealed.partition(" ")
        if not self.verify(signature, name, text):
            raise BadSignature(f"the record {name!r} is not one this service signed; it is ignored")
        return text
