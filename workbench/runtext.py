"""The Decode tab's output text, kept light for the browser whatever the run's length.

A span per decoding step made a 1,000-token run tens of thousands of DOM nodes and listeners, and
every update re-parsed them all (issue 31). The page now holds the run's text as one text node, or
three while a step is selected (before, the selected step in a <mark>, after); where each step's text
ends stays on the server (`RunState.ends`). A click sends the character offset it landed on, and
the server maps it to its step (`RunState.step_at`).
"""

from __future__ import annotations

import html

# In the page (gr.HTML js_on_load): the click's character offset in the whole text, counted in code
# points as Python counts them, sent as {offset}.
CLICK_JS = """
element.addEventListener('click', (e) => {
  const pre = element.querySelector('pre.out');
  const at = document.caretRangeFromPoint ? document.caretRangeFromPoint(e.clientX, e.clientY) : null;
  if (!pre || !at || !pre.contains(at.startContainer)) return;
  const before = document.createRange();
  before.setStart(pre, 0);
  before.setEnd(at.startContainer, at.startOffset);
  trigger('click', {offset: [...before.toString()].length});
});
"""


def text_html(text: str, ends: list[int], selected: int | None = None) -> str:
    """The run's text as HTML: plain escaped text, with the selected step's characters in one
    <mark data-step=N>. While streaming nothing is selected, so each update only appends (Gradio
    then sends only the appended part)."""
    if selected is None or not 0 <= selected < len(ends):
        return html.escape(text)
    a, b = (ends[selected - 1] if selected else 0), ends[selected]
    return (html.escape(text[:a]) + f'<mark class="sel" data-step="{selected}" title="step {selected}">'
            + html.escape(text[a:b]) + "</mark>" + html.escape(text[b:]))
