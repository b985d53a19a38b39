"""The bash reader: a command line parsed with tree-sitter's Bash grammar, and every node that
runs or may run code reported to a `Reading`.

Why tree-sitter: a shell is a programming language, and a hand-written splitter reads it the
way its author imagined, not the way bash does (quotes, here-documents, `$'…'`, process
substitution, nested `$( … )` were each a leak in the splitter this replaces). tree-sitter-bash
is the grammar editors and code hosts use for bash, maintained upstream and shipped as prebuilt
wheels; it parses in microseconds, never executes anything, and always returns a tree (with
ERROR nodes where the text is not bash, which this reader turns into a doubt).

The walk visits every node, so a command anywhere — in a pipeline, list, subshell, group,
function body, `if`/`for`/`case`, `[[ … ]]`, arithmetic, a redirection, a here-document body,
an assignment, `$( … )`, backquotes, `<( … )` / `>( … )` — is a run. Words are evaluated as bash
would pass them (`words.py`): quotes removed, escapes and ANSI-C quotes decoded, anything
computed marked so.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from loopwarden.policy.commands import configs
from loopwarden.policy.commands.runs import TERMINAL, Run, Stdin
from loopwarden.policy.commands.words import (
    ARITHMETIC,
    BRACES,
    GLOB,
    PARAMETER,
    PROCESS,
    SUBSTITUTION,
    UNREADABLE,
    Pieces,
    Word,
    ansi_c,
    unescape_double,
    unescape_unquoted,
)

if TYPE_CHECKING:
    from loopwarden.policy.commands.reading import Reading

Node = Any  # tree_sitter.Node (the module is imported on first use only)


@lru_cache(maxsize=1)
def _parser() -> Any:
    import tree_sitter
    import tree_sitter_bash

    return tree_sitter.Parser(tree_sitter.Language(tree_sitter_bash.language()))


def read(reading: Reading, text: str, via: str, parent: Run | None, depth: int) -> None:
    """Report every command of bash `text` to `reading`; a parse error is a doubt."""
    data = text.encode("utf-8", "surrogatepass")
    root = _parser().parse(data).root_node
    if root.has_error:
        reading.doubt(parent, "the line is not valid bash (it does not parse)")
    elif _skipped(root, data):
        reading.doubt(parent, "the grammar passed over part of the line")
    _Walk(reading, via, depth, data).node(root, parent, TERMINAL)


_ATOMIC = frozenset(
    {"heredoc_body", "string", "raw_string", "ansi_c_string", "translated_string", "comment",
     "word", "number", "heredoc_start", "heredoc_end"}
)  # fmt: skip


def _skipped(root: Node, data: bytes) -> bool:
    """Whether text outside every token of the tree is more than blanks and line
    continuations: the grammar dropped a word (it does, for `python3 - <<EOF`), so the tree is
    not what bash reads."""
    spans = []
    stack = [root]
    while stack:
        node = stack.pop()
        if node.child_count == 0 or node.type in _ATOMIC:
            spans.append((node.start_byte, node.end_byte))
        else:
            stack.extend(node.children)
    end = 0
    for start, stop in sorted(spans):
        if start > end and data[end:start].replace(b"\\\n", b"").strip():
            return True
        end = max(end, stop)
    return bool(data[end:].replace(b"\\\n", b"").strip())


_COMPUTED = {
    "simple_expansion": PARAMETER,
    "expansion": PARAMETER,
    "command_substitution": SUBSTITUTION,
    "arithmetic_expansion": ARITHMETIC,
    "brace_expression": BRACES,
    "extglob_pattern": GLOB,
}
_SPECIAL = re.compile(r"[\\*?\[{~]")
_ARITHMETIC_NODES = frozenset({"arithmetic_expansion", "subscript", "c_style_for_statement"})


class _Walk:
    def __init__(self, reading: Reading, via: str, depth: int, data: bytes) -> None:
        self.reading, self.via, self.depth, self.data = reading, via, depth, data

    def node(self, node: Node, parent: Run | None, stdin: Stdin, via: str = "") -> None:
        if not node.named_child_count:
            return  # a word, a number, an operator: nothing in it runs
        kind = node.type
        if kind == "command":
            self.command(node, parent, stdin, via)
        elif kind == "redirected_statement":
            self.redirected(node, parent, stdin, via)
        elif kind == "pipeline":
            for n, child in enumerate(c for c in node.named_children if c.type != "comment"):
                self.node(child, parent, stdin if n == 0 else Stdin("pipe"), via)
        elif kind == "function_definition":
            name = node.child_by_field_name("name")
            if name is not None:
                self.reading.functions.add(name.text.decode(errors="replace"))
            self.children(node, parent, stdin, "a function body")
        elif kind == "command_substitution":
            self.children(node, parent, stdin, "$(…)")
        elif kind == "process_substitution":
            self.children(node, parent, TERMINAL, node.children[0].type + "…)")
        elif kind == "variable_assignment":
            self.assignment(node, parent, stdin, via)
        else:
            if kind in _ARITHMETIC_NODES or (kind == "compound_statement" and _is_arith(node)):
                self.arithmetic(node, parent)
            self.children(node, parent, stdin, via)

    def children(self, node: Node, parent: Run | None, stdin: Stdin, via: str) -> None:
        for child in node.named_children:
            self.node(child, parent, stdin, via)

    def command(self, node: Node, parent: Run | None, stdin: Stdin, via: str) -> None:
        for child in node.named_children:
            if child.type == "variable_assignment":
                self.assignment(child, parent, stdin, via)
        name = node.child_by_field_name("name")
        stdin = _own_stdin(self, node, stdin)
        run = None
        if name is not None:
            argv = tuple(self.arguments([name, *node.children_by_field_name("argument")]))
            run = self.reading.add(
                argv,
                via=via or self.via,
                parent=parent,
                dialect="bash",
                stdin=stdin,
                depth=self.depth,
            )
        for child in node.named_children:
            if child.type != "variable_assignment":
                self.node(child, run or parent, stdin, "$(…)")

    def redirected(self, node: Node, parent: Run | None, stdin: Stdin, via: str) -> None:
        body = node.child_by_field_name("body")
        redirects = [c for c in node.named_children if c is not body]
        given = stdin
        for redirect in redirects:
            given = _stdin_of(self, redirect) or given
        if body is not None:
            self.node(body, parent, given, via)
        for redirect in redirects:
            self.children(redirect, parent, TERMINAL, "a redirection")

    def assignment(self, node: Node, parent: Run | None, stdin: Stdin, via: str) -> None:
        name = node.child_by_field_name("name")
        value = node.child_by_field_name("value")
        word = self.word(value) if value is not None else Word("")
        if name is not None:
            configs.assigned(self.reading, parent, name.text.decode(errors="replace"), word)
        if value is not None:
            self.node(value, parent, stdin, via or "an assignment")

    def arithmetic(self, node: Node, parent: Run | None) -> None:
        """bash evaluates a variable's value inside arithmetic, `a[$(…)]` included: a variable
        set in this line to text holding a substitution runs it."""
        stack = [node]
        while stack:
            current = stack.pop()
            if current.type in ("variable_name", "word"):
                value = self.reading.assigned.get(current.text.decode(errors="replace"), "")
                if value is None or "$(" in value or "`" in value:
                    self.reading.doubt(parent, "arithmetic evaluates a variable that may run code")
                    return
            stack.extend(current.named_children)

    def arguments(self, nodes: list[Node]) -> list[Word]:
        """Argument nodes as words: nodes with no space between them are one word (the
        grammar splits some, such as `$"…"`)."""
        groups: list[list[Node]] = []
        for node in nodes:
            if groups and self.touching(groups[-1][-1], node):
                groups[-1].append(node)
            else:
                groups.append([node])
        out = []
        for group in groups:
            if len(group) == 1:
                out.append(self.word(group[0]))
                continue
            pieces = Pieces()
            for n, part in enumerate(group):
                if part.type == "$" and n + 1 < len(group) and group[n + 1].type == "string":
                    continue  # `$"…"` is the string itself (a translated string)
                self.part(part, pieces, quoted=False)
            out.append(pieces.word())
        return out

    def touching(self, left: Node, right: Node) -> bool:
        """Whether two nodes are one word to bash: nothing between them, or only line
        continuations (bash removes `\\<newline>`; the grammar reads it as a space)."""
        if left.end_byte == right.start_byte:
            return True
        gap = self.data[left.end_byte : right.start_byte]
        return bool(gap) and not gap.replace(b"\\\n", b"")

    def word(self, node: Node) -> Word:
        if node.type == "command_name" and node.child_count == 1:
            node = node.children[0]
        if node.type == "word":
            text = node.text.decode("utf-8", "surrogateescape")
            if not _SPECIAL.search(text):
                return Word(text)  # the common case: nothing to unquote or expand
        pieces = Pieces()
        self.part(node, pieces, quoted=False)
        return pieces.word()

    def part(self, node: Node, pieces: Pieces, quoted: bool) -> None:
        kind = node.type
        text = node.text.decode("utf-8", "surrogateescape")
        if kind in ("word", "number", "$", "variable_name", "special_variable_name"):
            if quoted:
                pieces.text(text, True)
            else:
                unescape_unquoted(text, pieces)
        elif kind == "command_name" or kind == "concatenation":
            for child in node.children:
                self.part(child, pieces, quoted)
        elif kind == "raw_string":
            pieces.text(text[1:-1], True)
        elif kind == "ansi_c_string":
            pieces.text(ansi_c(text[2:-1]), True)
        elif kind in ("string", "translated_string"):
            for child in node.children:
                if child.type == "string_content":
                    pieces.text(unescape_double(child.text.decode(errors="surrogateescape")), True)
                elif child.type not in ('"', "$"):
                    self.part(child, pieces, quoted=True)
        elif kind == "process_substitution":
            pieces.computed(PROCESS, False)
        elif kind in _COMPUTED:
            pieces.computed(_COMPUTED[kind], splits=not quoted)
        else:
            pieces.computed(UNREADABLE, splits=True)


def _is_arith(node: Node) -> bool:
    return bool(node.children) and node.children[0].type == "(("


def _own_stdin(walk: _Walk, node: Node, stdin: Stdin) -> Stdin:
    for redirect in node.children_by_field_name("redirect"):
        stdin = _stdin_of(walk, redirect) or stdin
    return stdin


def _stdin_of(walk: _Walk, redirect: Node) -> Stdin | None:
    """The standard input a redirection gives, if it gives one."""
    kind = redirect.type
    if kind == "heredoc_redirect":
        return Stdin("heredoc", _heredoc(redirect))
    if kind == "herestring_redirect":
        target = [c for c in redirect.named_children]
        word = walk.arguments(target) if target else []
        text = word[0] if word else Word("")
        return Stdin("herestring", Word(text.text + "\n") if text.text is not None else text)
    if kind == "file_redirect":
        operator = next((c.type for c in redirect.children if not c.is_named), "")
        if operator == "<":
            target = redirect.child_by_field_name("destination")
            if target is not None and target.type == "process_substitution":
                return Stdin("process")
            return Stdin("file")
    return None


def _heredoc(redirect: Node) -> Word:
    """A here-document's text: literal if its delimiter is quoted or nothing in it expands."""
    start = next((c for c in redirect.children if c.type == "heredoc_start"), None)
    body = next((c for c in redirect.children if c.type == "heredoc_body"), None)
    if body is None:
        return Word("")
    text = body.text.decode("utf-8", "surrogateescape")
    quoted = start is not None and any(ch in start.text for ch in b"'\"\\")
    if not quoted and any(c.type in _COMPUTED for c in body.named_children):
        return Word(None, SUBSTITUTION)
    if any(c.type == "<<-" for c in redirect.children):
        text = "\n".join(line.lstrip("\t") for line in text.split("\n"))
    return Word(text if quoted else unescape_heredoc(text))


def unescape_heredoc(text: str) -> str:
    """An unquoted here-document's text: `\\$`, backquote, `\\\\` and line continuations."""
    return text.replace("\\\n", "").replace("\\$", "$").replace("\\`", "`").replace("\\\\", "\\")
