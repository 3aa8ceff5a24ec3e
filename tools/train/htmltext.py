"""Plain text out of documentation HTML (PostgreSQL, SQLite, Django, Go docs).

Navigation, scripts and styles are dropped, <pre> blocks keep their layout,
block elements become line breaks and list items get a "* " bullet.
"""
import html.parser
import re

SKIP_TAGS = {"script", "style", "head", "nav", "noscript", "svg", "button", "form", "select"}
SKIP_CLASSES = {
    "navheader", "navfooter", "sphinxsidebar", "related", "footer", "header",
    "breadcrumbs", "nav", "navigation", "menu", "nosearch", "toc", "search",
    "headerlink", "submenu", "fancy_toc", "doc-toc", "sidebar",
}
SKIP_IDS = {"hd", "ft", "billboard", "footer", "header", "toc", "navbar", "menu", "searchmenu", "submenu"}
BLOCK_TAGS = {
    "p", "div", "section", "article", "main", "h1", "h2", "h3", "h4", "h5", "h6",
    "ul", "ol", "li", "dl", "dt", "dd", "table", "tr", "blockquote", "pre", "br",
    "hr", "figure", "figcaption", "caption", "body", "html", "center",
}
VOID_TAGS = {"br", "hr", "img", "meta", "link", "input", "wbr", "col", "area", "base", "source"}


class _Extractor(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.out = []
        self.stack = []        # (tag, skipping) for open non-void elements
        self.skip_depth = 0
        self.pre_depth = 0

    def _block(self):
        self.out.append("\n")

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = set((a.get("class") or "").split())
        skip = (tag in SKIP_TAGS or bool(classes & SKIP_CLASSES)
                or (a.get("id") or "") in SKIP_IDS or a.get("role") == "navigation")
        if tag in VOID_TAGS:
            if tag in ("br", "hr") and not self.skip_depth:
                self._block()
            return
        self.stack.append((tag, skip))
        if skip:
            self.skip_depth += 1
        if self.skip_depth:
            return
        if tag in BLOCK_TAGS:
            self._block()
        if tag == "pre":
            self.pre_depth += 1
        if tag == "li":
            self.out.append("* ")
        if tag in ("td", "th"):
            self.out.append(" ")

    def handle_endtag(self, tag):
        if tag in VOID_TAGS:
            return
        # pop to the matching open tag (tolerates unclosed <p>, <li>, ...)
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                break
        else:
            return
        while len(self.stack) > i:
            t, skip = self.stack.pop()
            if skip:
                self.skip_depth -= 1
            elif not self.skip_depth:
                if t == "pre":
                    self.pre_depth -= 1
                if t in BLOCK_TAGS:
                    self._block()

    def handle_data(self, data):
        if self.skip_depth:
            return
        if self.pre_depth:
            self.out.append("\x00PRE" + data.replace("\n", "\x00NL") + "\x00END")
        else:
            self.out.append(re.sub(r"\s+", " ", data))


def html_to_text(src):
    p = _Extractor()
    p.feed(src)
    p.close()
    raw = "".join(p.out)
    # normal text: tidy each line; pre text: restore verbatim newlines
    lines = []
    for line in raw.split("\n"):
        if "\x00PRE" in line:
            line = re.sub(r"\x00PRE|\x00END", "", line).replace("\x00NL", "\n")
            lines.append(line.rstrip())
        else:
            line = re.sub(r"[ \t]+", " ", line).strip()
            lines.append(line)
    text = "\n".join(lines)
    text = re.sub(r"\n{3,}", "\n\n", text)
    text = re.sub(r"^\*[ \t]*\n+(?=[^*\s])", "* ", text, flags=re.M)
    text = re.sub(r"^\*[ \t]*\n", "", text, flags=re.M)
    return text.strip() + "\n"
