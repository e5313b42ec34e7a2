"""``/api/profile``: the user's standing instructions and preferences, which every block carries."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Query, status

from yak_pipeline.api.dependencies import Caller, Services
from yak_pipeline.api.schemas.base import UserId
from yak_pipeline.api.schemas.profile import ProfileDrop, ProfileDropOut, ProfileOut
from yak_pipeline.services.profile import drop_profile_lines, show_profile

router = APIRouter(prefix="/api/profile", tags=["profile"])


@router.get("", response_model=ProfileOut)
def profile(caller: Caller, services: Services, user_id: UserId = Query(description="Whose profile.")) -> ProfileOut:
    """The user's profile: ``sent`` is exactly what every memory block carries now (instructions
    first, newest first, within YAK_PROFILE_TOKENS), ``lines`` every line with why one is not sent."""
    user = caller.acting_for(user_id)
    return ProfileOut.model_validate(show_profile(services.database, user,
                                                  token_budget=services.settings.profile_tokens).as_dict())


@router.post("/drop", response_model=ProfileDropOut)
def drop(body: ProfileDrop, caller: Caller, services: Services) -> ProfileDropOut:
    """Take lines out of the user's profile in one action (``keep``: put them back). The exchanges
    stay memories, recallable when a question is about them; to remove one, forget its memory."""
    user = caller.acting_for(body.user_id)
    changed = drop_profile_lines(services.database, user, [str(i) for i in body.ids], actor=caller.actor,
                                 keep=body.keep)
    if not changed:
        raise HTTPException(status.HTTP_404_NOT_FOUND,
                            "no such profile line of this user" + ("" if body.keep else " (or already dropped)"))
    return ProfileDropOut(changed=changed)
