"""``/api/keys``: create, list and revoke API keys (admin key)."""

from __future__ import annotations

from uuid import UUID

from fastapi import APIRouter, HTTPException, status

from yak_pipeline.api.dependencies import Caller, Services
from yak_pipeline.api.schemas.operations import KeyCreate, KeyCreated, KeyOut
from yak_pipeline.services import api_keys
from yak_pipeline.services.api_keys import ApiKey

router = APIRouter(prefix="/api/keys", tags=["keys"])


def _out(key: ApiKey) -> dict:
    return {"id": key.id, "prefix": key.prefix, "user_id": key.user_id, "admin": key.is_admin, "label": key.label,
            "created_at": key.created_at, "revoked_at": key.revoked_at, "read_only": key.read_only}


@router.post("", response_model=KeyCreated, status_code=status.HTTP_201_CREATED)
def create_key(body: KeyCreate, caller: Caller, services: Services) -> KeyCreated:
    """Create a key, admin or scoped to one user; the key is in this answer and never again."""
    caller.require_admin()
    record, key = api_keys.create_key(services.database, user_id=body.user_id, label=body.label, actor=caller.actor,
                                      read_only=body.read_only)
    return KeyCreated(**_out(record), key=key)


@router.get("", response_model=list[KeyOut])
def list_keys(caller: Caller, services: Services, include_revoked: bool = False) -> list[KeyOut]:
    """Stored keys, newest first (prefixes only, never the keys)."""
    caller.require_admin()
    keys = api_keys.list_keys(services.database, include_revoked=include_revoked)
    return [KeyOut(**_out(k)) for k in keys]


@router.delete("/{key_id}", response_model=KeyOut)
def revoke_key(key_id: UUID, caller: Caller, services: Services) -> KeyOut:
    """Revoke a key; requests with it are refused from now on."""
    caller.require_admin()
    revoked = api_keys.revoke_key(services.database, key_id, actor=caller.actor)
    if revoked is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no live API key {key_id}")
    return KeyOut(**_out(revoked))
