"""HTML forms read as a browser would send them, for the tests of the issuer's and the
console's pages without a browser (tests/browser drives a real one)."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser


@dataclass
class Form:
    action: str
    method: str
    fields: dict[str, str] = field(default_factory=dict)
    button: str = ""


class Forms(HTMLParser):
    """The forms of a page, as a browser would send them: where each goes, its fields, its
    button's text; and whether the page has any script (the issuer's and the console's
    pages are read with it)."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.forms: list[Form] = []
        self.scripts = 0
        self._in_button = False
        self.feed(page)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {name: value or "" for name, value in attrs}
        if tag == "script" or any(name.startswith("on") for name in attributes):
            self.scripts += 1
        if tag == "form":
            self.forms.append(Form(attributes.get("action", ""), attributes.get("method", "get")))
        elif tag == "input" and self.forms and "name" in attributes:
            self.forms[-1].fields[attributes["name"]] = attributes.get("value", "")
        elif tag == "button":
            self._in_button = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "button":
            self._in_button = False

    def handle_data(self, data: str) -> None:
        if self._in_button:
            self.forms[-1].button += data

    def by_button(self, label: str) -> Form:
        """The form whose button says ``label``."""
        for form in self.forms:
            if form.button.strip() == label:
                return form
        raise AssertionError(f"no form with a button {label!r} among {self.forms}")
