"""Which answer may show: per browser session and tab, the input on screen and the newest prediction.

A stroke's answer can arrive after the Predict click's, and a drawing's after an example was picked;
Screen keeps a late answer to an older input from replacing a newer one (docs/serving.md: "The demo answers for
what is on screen"), and `gated` puts it in front of an event's handler.
"""

import threading
from collections.abc import Callable
from typing import Any

import gradio as gr

DRAWING, UPLOAD = "drawing", "upload"  # the two inputs a tab can have on screen
ANSWER = "answer"  # where a handler's updates carry the API's answer for the Screen (not a component)


class Screen:
    """What one tab shows in one browser session: which input is on screen (the drawing or the upload)
    and which prediction started last. An answer is shown only if it is for the input on screen and no
    prediction of the tab started after it: a late answer to an older drawing (a stroke's, slower than
    the Predict click that followed it, or one drawn before an example was picked) never replaces a
    newer one. Kept in a gr.State, one per session and tab, shared by that session's concurrent events."""

    def __init__(self, source: str = DRAWING) -> None:
        self.source, self.started = source, 0
        self.shown = self.followed = 0  # the tickets of the answer on screen and of the last one followed up
        self.answer: dict[str, Any] | None = None  # the API's answer on screen (None: a prompt or an error)
        self.lock = threading.Lock()

    def __deepcopy__(self, memo: dict) -> "Screen":  # gr.State copies its value for each new session
        return Screen(self.source)

    def start(self, source: str | None = None) -> int:
        """A prediction starts (and puts `source` on screen, if given): its ticket."""
        with self.lock:
            self.source = source or self.source
            self.started += 1
            return self.started

    def switch(self, source: str) -> int | None:
        """Put `source` on screen, starting a prediction, unless it is on screen already (None)."""
        with self.lock:
            if self.source == source:
                return None
            self.source, self.started = source, self.started + 1
            return self.started

    def shows(self, ticket: int, source: str) -> bool:
        return ticket == self.started and source == self.source

    def show(self, ticket: int, source: str, answer: dict[str, Any] | None = None) -> bool:
        """Whether the answer of `ticket` shows (see shows); if it does, it is the answer on screen."""
        with self.lock:
            if not self.shows(ticket, source):
                return False
            self.shown, self.answer = ticket, answer
            return True

    def follow(self) -> tuple[bool, dict[str, Any] | None]:
        """Whether the answer on screen still needs its follow-up (routing maps, Fig. 4), once per answer,
        and that answer: taken in the same step, so a newer answer shown while a follow-up waited is the
        one it draws (and the newer answer's own follow-up then has nothing left to do)."""
        with self.lock:
            if self.followed == self.shown:
                return False, None
            self.followed = self.shown
            return True, self.answer


def gated(
    handler: Callable[..., dict], source: str, switch: bool = False, tab_select: bool = False
) -> Callable[..., dict]:
    """An event function: `handler`'s updates (keyed by component), or none at all (gr.skip()) when the
    Screen (its first input) says they are not for what is on screen. `switch`: the event puts `source`
    on screen; `tab_select`: it does only if `source` is not on screen yet (a tab selected while its input
    is on screen has nothing new to say). The handler's answer (under ANSWER) goes to the Screen, for the
    follow-up, not to the page."""

    def run(screen: Screen, *inputs: Any) -> dict:
        ticket = screen.switch(source) if tab_select else screen.start(source if switch else None)
        if ticket is None:
            return gr.skip()
        updates = handler(*inputs)
        answer = updates.pop(ANSWER, None)
        return updates if screen.show(ticket, source, answer) else gr.skip()

    return run
