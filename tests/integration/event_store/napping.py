"""The social registry plus ``NapPost``: a post whose handler naps first (inside the command's
transaction, after the load) and writes who handled it into the text. The processors' tests
pause a processor in that nap (``TRIBUTARY_COMMAND_HANDLERS=...napping:napping_registry``)."""

import os
import time
from dataclasses import dataclass
from pathlib import Path

from event_store import Command, CommandRegistry
from event_store import HandlerContext as Ctx
from examples.social import prepare_database as prepare_database  # the processor's hook
from examples.social.domain import social_registry
from examples.social.posts import Post, post_stream


@dataclass(frozen=True)
class NapPost(Command):
    post_id: int
    author_id: int
    nap_s: float
    marks: str  # a folder: the handler leaves ``<post_id>-<pid>`` there as its nap starts
    nap_once: bool = False  # only the first handler to run the command naps


def napping_registry() -> CommandRegistry:
    registry = social_registry()

    @registry.handler(NapPost, Post, stream=lambda c: post_stream(c.post_id))
    def nap_post(post: Post, c: NapPost, ctx: Ctx) -> None:
        marks = Path(c.marks)
        first = not any(marks.glob(f"{c.post_id}-*"))
        (marks / f"{c.post_id}-{os.getpid()}").touch()
        if first or not c.nap_once:
            time.sleep(c.nap_s)
        post.create(c.post_id, c.author_id, f"handled by pid {os.getpid()}", ctx.now)

    return registry
