"""The model bar above the tabs: which model this session decodes with, whether prompts go through
its chat template, and a header saying what is loaded (model, heads, dtype, device, backend).

The choice is per session (Session.model): two researchers on one app can each study their own model,
the engines being shared through the workbench's bounded cache (workbench/models.py).
"""

from __future__ import annotations

import gradio as gr

from .core import Workbench
from .models import describe, model_choices
from .page import ENGINE_QUEUE, PRIVATE, Page
from .session import Session, UserError


class ModelBar:
    def __init__(self, wb: Workbench):
        self.wb = wb

    def select(self, session: Session, name: object) -> tuple[str, bool | None, str | None]:
        """Switch the session to `name`: -> (header, chat toggle's value, decoding mode; None to leave
        them). A model without heads decodes AR by default (as the CLI does) and its header says so. A
        model that cannot load (smollm2 not fetched yet, a bad folder) leaves the session where it was."""
        try:
            engine = self.wb.choose_model(session, name)
        except UserError as e:
            return f"✗ {e}\n\n{self.header(session)}", None, None
        return describe(engine), engine.has_chat_template, engine.default_mode

    def header(self, session: Session) -> str:
        try:
            return describe(self.wb.engine_of(session))
        except UserError as e:
            return f"✗ {e}"

    def chat_default(self, session: Session) -> bool:
        """The toggle's value: the session's choice, else on for models with a chat template."""
        if session.chat is not None:
            return session.chat
        try:
            return self.wb.engine_of(session).has_chat_template
        except UserError:
            return False

    def layout(self, page: Page) -> None:
        with gr.Row(equal_height=True):
            self.model = gr.Dropdown(model_choices(self.wb.model), value=self.wb.model, label="model",
                                     allow_custom_value=False, scale=2, elem_id="model-pick")
            self.chat = gr.Checkbox(self.wb.engine.has_chat_template, label="chat template",
                                    info="wrap prompts in the model's chat turns", scale=1, elem_id="chat-toggle")
            self.info = gr.Markdown(describe(self.wb.engine), elem_id="model-header")

    def wire(self, page: Page, mode: gr.Radio) -> None:
        """`mode`: the Decode tab's mode radio, set to the chosen model's default."""
        def select(name, request: gr.Request):
            header, chat, mode_value = self.select(page.session(request), name)
            return header, gr.update() if chat is None else chat, gr.update() if mode_value is None else mode_value

        self.model.input(select, self.model, [self.info, self.chat, mode], concurrency_limit=1,
                         concurrency_id=ENGINE_QUEUE, **PRIVATE)

        def toggle(on, request: gr.Request):
            page.session(request).chat = bool(on)

        self.chat.input(toggle, self.chat, None, queue=False, **PRIVATE)

    def on_load(self, session: Session) -> tuple:
        """(selector, chat toggle, header, decoding mode) for a page that opens in `session`."""
        try:
            mode = self.wb.engine_of(session).default_mode
        except UserError:
            mode = "ar"
        return self.wb.model_of(session), self.chat_default(session), self.header(session), mode
