"""How the bash reader evaluates a word: its text after quote removal, or why it is computed,
and the code in it — the closed set of word constructs of `WORDS`, the `${…}` forms
`expansions.py` models, arithmetic masked into text `arithmetic.py` reads, and an audit of the
text the grammar left as plain words (a backquote or `$(` there is a construct it did not read).

`Evaluator` holds what a walk of one line shares (the reading, the line's bytes); `Found`
collects, for one command, the code its words hold (run after the command is recorded, as
runs of it) and the doubts they raise. Values the reader can know without running anything
are named too: a word that is always a number (`$(( ))`, `${#x}`, `$(date +%s)`) or an
absolute path (`$(mktemp)`).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from loopwarden.policy.commands import arithmetic, expansions, variables
from loopwarden.policy.commands.reading import NUMBER
from loopwarden.policy.commands.regexes import lazy
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
    from loopwarden.policy.commands.runs import Run

Node = Any  # tree_sitter.Node

WORDS = frozenset(
    {"word", "number", "string", "raw_string", "ansi_c_string", "translated_string",
     "concatenation", "simple_expansion", "expansion", "command_substitution",
     "arithmetic_expansion", "process_substitution", "brace_expression", "extglob_pattern",
     "command_name", "variable_name", "special_variable_name", "$"}
)  # fmt: skip
"""Every word node the reader evaluates (`Evaluator.part`); `$( … )`, backquotes, `<( … )`
and `>( … )` in them are read as commands."""

_SPECIAL_BYTES = lazy(rb"[\\*?\[{~$`]")
_NUMERIC_DATE = lazy(r"^\+(%[sNYmdHMSjuwVGgCyeklIp%])+$")

_CONSTRUCTS = {
    "ERROR": "text that is not bash",
    "heredoc_body": "a here-document",
    "array": "an array",
    "subscript": "an array subscript",
    "regex": "a pattern",
    "subshell": "a `( )` subshell inside a command",
    "compound_statement": "a `{ }` group inside a command",
    "if_statement": "an `if` block inside a command",
    "while_statement": "a loop inside a command",
    "for_statement": "a `for` loop inside a command",
    "case_statement": "a `case` block inside a command",
    "test_command": "a `[[ ]]` test inside a command",
}


class Found:
    """What reading a command's words found besides the words: code in them to walk (with
    how it runs), and doubts."""

    __slots__ = ("code", "doubts")

    def __init__(self) -> None:
        self.code: list[tuple[Node, str]] = []
        self.doubts: list[str] = []


def unread(kind: str) -> str:
    name = _CONSTRUCTS.get(kind, "a shell construct")
    return f"{name} loopwarden does not read is part of the line"


def identifier(name: str) -> bool:
    return bool(name) and (name[0].isalpha() or name[0] == "_")


def audit(raw: bytes, quoted: bool) -> str | None:
    """What in a word's text the grammar should have parsed but did not: a substitution
    (a doubt: its message), or an expansion (`"$"`: the word is computed). None: nothing."""
    if b"$" not in raw and b"`" not in raw and (quoted or b"(" not in raw):
        return None
    text = raw.decode("utf-8", "surrogateescape")
    i, n = 0, len(text)
    while i < n:
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if char == "`":
            return "a backquote substitution the grammar did not read: use $( … ) instead"
        if char == "$" and i + 1 < n:
            following = text[i + 1]
            if following in "([{":
                return "a substitution or expansion the grammar did not read is part of a word"
            if following.isalnum() or following in "_@*#?$!-":
                return "$"
        if not quoted and char in "<>" and i + 1 < n and text[i + 1] == "(":
            return "a process substitution the grammar did not read is part of a word"
        i += 1
    return None


def text(walk: Evaluator, node: Node) -> str:
    return walk.data[node.start_byte : node.end_byte].decode("utf-8", "surrogateescape")


def subscript_check(reading: Reading, run: Run | None, name: str, index: str, found: Found) -> None:
    """An indexed array's subscript is arithmetic (an associative one's is a string)."""
    if index.strip() in ("@", "*"):
        return
    text = variables._plain(index)
    if text is None:
        if "$(" in index or "`" in index:
            reading.later(run, lambda r: None if name in r.assoc else variables.SUBSCRIPT_CODE)
            return
        found.doubts.append(variables.SUBSCRIPT_EXPANSION)
        return
    reading.later(run, lambda r: None if name in r.assoc else arithmetic.doubt(text, r.numeric))


def _arithmetictext(reading: Reading, text: str, found: Found) -> None:
    plain = variables._plain(text)
    if plain is None:
        found.doubts.append(
            "a `${x:offset:length}` bound holds a command substitution, which bash runs as it "
            "evaluates it: compute the value into a variable first"
            if "$(" in text or "`" in text
            else "a `${x:offset:length}` bound holds an expansion loopwarden does not read"
        )
        return
    reading.later(None, lambda r: arithmetic.doubt(plain, r.numeric))


def arithmetic_word(
    walk: Evaluator, node: Node, word: Word, parent: Run | None, found: Found
) -> None:
    """An operand bash evaluates as arithmetic (`[[ $x -eq 1 ]]`)."""
    if word.text is not None:
        text = word.text
        walk.reading.later(parent, lambda r: arithmetic.doubt(text, r.numeric))
    elif word.params is not None and word.template == "\0":
        name = word.params[0].split("\0")[0]
        walk.reading.later(
            parent,
            lambda r: None if r.numeric(name) else (
                "arithmetic reads a variable this line does not set to a number (bash would "
                "evaluate its text, and a subscript there runs a command)"
            ),
        )  # fmt: skip
    elif not (word.kind == ARITHMETIC or numeric(walk, node) or _special_number(node)):
        found.doubts.append(
            "a `[[ … ]]` comparison evaluates computed text as arithmetic, which may run a command"
        )


def _special_number(node: Node) -> bool:
    """`$#`, `$?`, `$$`, `$!` (also quoted): numbers bash keeps."""
    if node.type == "string" and len(node.named_children) == 1:
        node = node.named_children[0]
    if node.type != "simple_expansion":
        return False
    return node.text.decode("utf-8", "surrogateescape")[1:] in arithmetic.BASH_NUMBERS


def masked(
    walk: Evaluator, container: Node, start: int, end: int, found: Found
) -> tuple[str, dict[str, bool]]:
    """The arithmetic text between two offsets with `$x` / `${x}` read as the variable, and
    every other computed part (a substitution, a nested arithmetic) as a placeholder that
    holds a number or not. The substitutions are walked as code."""
    pieces: list[str] = []
    marks: dict[str, bool] = {}
    cursor = start
    stack = [container]
    spans: list[Node] = []
    while stack:
        node = stack.pop()
        for child in reversed(node.named_children):
            if child.end_byte <= start or child.start_byte >= end:
                continue
            if child.type in ("command_substitution", "process_substitution",
                              "arithmetic_expansion", "expansion", "simple_expansion"):  # fmt: skip
                spans.append(child)
            else:
                stack.append(child)
    for node in sorted(spans, key=lambda n: n.start_byte):
        if node.start_byte < cursor:
            continue
        pieces.append(walk.data[cursor : node.start_byte].decode("utf-8", "surrogateescape"))
        token = f"{arithmetic.MARK}{len(marks)}{arithmetic.MARK}"
        kind = node.type
        if kind == "simple_expansion":
            name = node.text.decode("utf-8", "surrogateescape")[1:]
            if identifier(name):
                pieces.append(name)
            else:
                marks[token] = name in arithmetic.BASH_NUMBERS
                pieces.append(token)
        elif kind == "expansion":
            model = expansions.parse(node.text.decode("utf-8", "surrogateescape").lstrip())
            if (
                model is not None
                and model.plain
                and model.subscript is None
                and identifier(model.name)
            ):
                pieces.append(model.name)
            else:
                marks[token] = model is not None and model.length
                pieces.append(token)
                walk.expansion(node, Pieces(), True, found)
        elif kind == "arithmetic_expansion":
            marks[token] = True
            pieces.append(token)
            walk.arithmetic(node, node.children[0].end_byte, node.children[-1].start_byte, found)
        else:
            marks[token] = kind == "command_substitution" and numeric(walk, node)
            pieces.append(token)
            found.code.append((node, "$(…)"))
        cursor = node.end_byte
    pieces.append(walk.data[cursor:end].decode("utf-8", "surrogateescape"))
    return "".join(pieces), marks


def numeric(walk: Evaluator, node: Node) -> bool:
    """Whether a word node always becomes a number: `$(( … ))`, `${#x}`, or the output of a
    command that prints one (`date +%s`, `wc -l < f`, `nproc`, `id -u`)."""
    kind = node.type
    if kind == "arithmetic_expansion" or kind == "number":
        return True
    if kind == "string" and len(node.named_children) == 1:
        return numeric(walk, node.named_children[0])
    if kind == "expansion":
        model = expansions.parse(node.text.decode("utf-8", "surrogateescape").lstrip())
        return model is not None and model.length
    if kind != "command_substitution":
        return False
    statements = [c for c in node.named_children if c.type != "comment"]
    if len(statements) != 1:
        return False
    statement = statements[0]
    redirects: list[Node] = []
    if statement.type == "redirected_statement":
        body = statement.child_by_field_name("body")
        redirects = [c for c in statement.named_children if body is None or c.id != body.id]
        statement = body
    if statement is None or statement.type != "command":
        return False
    if any(r.type != "file_redirect" or b">" in r.text.split(b"<")[0] for r in redirects):
        return False
    words = [c.text.decode("utf-8", "surrogateescape") for c in statement.named_children]
    if any(re.search(r"[^\w./%+:=-]", w) for w in words):
        return False
    program, args = words[0], words[1:]
    if program == "date":
        return all(_NUMERIC_DATE.match(a) for a in args) and bool(args)
    if program == "wc":
        return bool(args) and all(re.fullmatch(r"-[lcwm]", a) for a in args)
    if program == "nproc":
        return all(a == "--all" for a in args)
    if program == "id":
        return args in (["-u"], ["-g"], ["-ru"], ["-rg"])
    if program == "git":
        return args[:2] == ["rev-list", "--count"]
    if program == "seq":
        return bool(args) and all(re.fullmatch(r"-?\d+(\.\d+)?|-w", a) for a in args)
    if program == "grep":  # one count: no file name with it (one file at most, no -H)
        operands = [a for a in args if not a.startswith("-")]
        return "-c" in args and "-H" not in args and len(operands) <= 2
    return False


def keys_of(node: Node) -> str | None:
    """The array whose subscripts a word is (`"${!a[@]}"`, `${!a[*]}`), if it is one."""
    if node.type == "string" and len(node.named_children) == 1:
        node = node.named_children[0]
    if node.type != "expansion":
        return None
    model = expansions.parse(node.text.decode("utf-8", "surrogateescape").lstrip())
    if model is None or model.prefix != "!" or model.subscript not in ("@", "*"):
        return None
    return model.name


def path(node: Node) -> bool:
    """Whether a word node is the output of a command that prints an absolute path (`mktemp`,
    `mktemp -d`, `pwd`, `git rev-parse --show-toplevel`, `realpath X`)."""
    if node.type == "string" and len(node.named_children) == 1:
        node = node.named_children[0]
    if node.type != "command_substitution":
        return False
    statements = [c for c in node.named_children if c.type != "comment"]
    if len(statements) != 1 or statements[0].type != "command":
        return False
    words = [c.text.decode("utf-8", "surrogateescape") for c in statements[0].named_children]
    program, args = words[0], words[1:]
    if program == "mktemp":
        return all(a in ("-d", "-q", "-u", "--directory", "--quiet", "--dry-run") for a in args)
    if program == "pwd":
        return all(a in ("-P", "-L") for a in args)
    if program == "git":
        return args == ["rev-parse", "--show-toplevel"]
    return program in ("realpath", "readlink") and ("-f" in args or program == "realpath")


def numeric_braces(node: Node) -> bool:
    return bool(re.fullmatch(rb"\{-?\d+\.\.-?\d+(\.\.-?\d+)?\}", node.text))


class Evaluator:
    """Evaluates the words of one line (see the module docstring)."""

    def __init__(self, reading: Reading, data: bytes) -> None:
        self.reading, self.data = reading, data

    def arguments(self, nodes: list[Node], found: Found) -> list[Word]:
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
                out.append(self.word(group[0], found))
                continue
            pieces = Pieces()
            for n, part in enumerate(group):
                if part.type == "$" and n + 1 < len(group) and group[n + 1].type == "string":
                    continue  # `$"…"` is the string itself (a translated string)
                self.part(part, pieces, False, found)
            out.append(pieces.word())
        return out

    def touching(self, left: Node, right: Node) -> bool:
        """Whether two nodes are one word to bash: nothing between them, or only line
        continuations (bash removes `\\<newline>`; the grammar reads it as a space)."""
        if left.end_byte == right.start_byte:
            return True
        gap = self.data[left.end_byte : right.start_byte]
        return bool(gap) and not gap.replace(b"\\\n", b"")

    def word(self, node: Node, found: Found) -> Word:
        if node.type == "command_name" and node.child_count == 1:
            node = node.child(0)
        if node.type == "word":
            raw = node.text
            if not _SPECIAL_BYTES.search(raw):
                return Word(raw.decode("utf-8", "surrogateescape"))  # nothing to unquote
        pieces = Pieces()
        self.part(node, pieces, False, found)
        return pieces.word()

    def part(self, node: Node, pieces: Pieces, quoted: bool, found: Found) -> None:
        """One node of a word into `pieces`, its code into `found` (see WORDS)."""
        kind = node.type
        if kind in ("word", "number", "variable_name", "special_variable_name", "$"):
            _plain(node, pieces, quoted, found)
        elif kind in ("command_name", "concatenation"):
            for child in node.children:
                self.part(child, pieces, quoted, found)
        elif kind == "raw_string":
            pieces.text(node.text.decode("utf-8", "surrogateescape")[1:-1], True)
        elif kind == "ansi_c_string":
            pieces.text(ansi_c(node.text.decode("utf-8", "surrogateescape")[2:-1]), True)
        elif kind in ("string", "translated_string"):
            self.string(node, pieces, found)
        elif kind == "simple_expansion":
            name = node.text.decode("utf-8", "surrogateescape")[1:]
            splits = not quoted or name == "@"
            pieces.computed(
                PARAMETER, splits, name if name[:1].isalpha() or name[:1] == "_" else None
            )
        elif kind == "expansion":
            self.expansion(node, pieces, quoted, found)
        elif kind == "command_substitution":
            pieces.computed(SUBSTITUTION, not quoted)
            found.code.append((node, "$(…)"))
        elif kind == "arithmetic_expansion":
            pieces.computed(ARITHMETIC, not quoted)
            opening, closing = node.children[0], node.children[-1]
            self.arithmetic(node, opening.end_byte, closing.start_byte, found)
        elif kind == "process_substitution":
            pieces.computed(PROCESS, False)
            found.code.append((node, node.children[0].type + "…)"))
        elif kind == "brace_expression":
            pieces.computed(BRACES, True)
        elif kind == "extglob_pattern":
            why = audit(node.text, quoted=False)
            if why is not None and why != "$":
                found.doubts.append(why)
            pieces.computed(GLOB, True)
        else:
            found.doubts.append(unread(kind))
            pieces.computed(UNREADABLE, True)

    def string(self, node: Node, pieces: Pieces, found: Found) -> None:
        """A double-quoted string: its text unescaped, its expansions walked as quoted parts."""
        for child in node.children:
            if child.type == "string_content":
                why = audit(child.text, quoted=True)
                if why is not None and why != "$":
                    found.doubts.append(why)
                    pieces.computed(UNREADABLE, True)
                elif why == "$":
                    pieces.computed(PARAMETER, False)
                else:
                    text = child.text.decode("utf-8", "surrogateescape")
                    pieces.text(unescape_double(text), True)
            elif child.type not in ('"', "$", '$"'):
                self.part(child, pieces, True, found)

    def expansion(self, node: Node, pieces: Pieces, quoted: bool, found: Found) -> None:
        """`${…}` as `expansions.py` models it; its parts' code walked, its arithmetic checked."""
        raw = node.text.decode("utf-8", "surrogateescape")
        if raw[:1].isspace():  # the grammar puts a blank before `${` in a string into the node
            stripped = raw.lstrip()
            pieces.text(raw[: len(raw) - len(stripped)], quoted)
            raw = stripped
        model = expansions.parse(raw)
        if model is None:
            found.doubts.append("a `${…}` form loopwarden does not read is part of the line")
            pieces.computed(UNREADABLE, True)
            return
        why = expansions.doubt(model)
        if why is not None:
            found.doubts.append(why)
        reading = self.reading
        if model.prefix == "!" and not model.operator and model.subscript is None:
            name = model.name
            reading.later(None, lambda r: variables._names_of(r, name))
        if model.subscript is not None and model.subscript not in ("@", "*"):
            subscript_check(reading, None, model.name, model.subscript, found)
        if model.operator == ":":
            for bound in expansions.substring(model.rest):
                if bound.strip():
                    _arithmetictext(reading, bound, found)
        self.inner(node, found)
        splits = not quoted or (model.all_elements and "@" in (model.subscript, model.name))
        if model.length:
            pieces.computed(ARITHMETIC, not quoted)
        elif model.plain and model.prefix == "":
            pieces.computed(PARAMETER, splits, model.name if identifier(model.name) else None)
        elif model.operator in (":-", "-") and re.fullmatch(r"[\w./:@%+,-]*", model.rest):
            param = model.name + "\0" + model.rest if identifier(model.name) else None
            pieces.computed(PARAMETER, splits, param)
        else:
            pieces.computed(PARAMETER, splits)

    def inner(self, node: Node, found: Found) -> None:
        """The code inside a `${…}` or a subscript: substitutions walked, nested expansions
        checked, the text the grammar left as words audited."""
        for child in node.named_children:
            kind = child.type
            if kind in ("command_substitution", "process_substitution"):
                found.code.append((child, "$(…)"))
            elif kind == "arithmetic_expansion":
                self.arithmetic(
                    child, child.children[0].end_byte, child.children[-1].start_byte, found
                )
            elif kind == "expansion":
                self.expansion(child, Pieces(), True, found)
            elif kind in ("word", "regex", "string_content", "raw_string", "extglob_pattern"):
                # in a double-quoted `${x:-'…'}` the quotes are text and `$( … )` runs
                why = audit(child.text, quoted=kind in ("string_content", "raw_string"))
                if why is not None and why != "$":
                    found.doubts.append(
                        "a substitution inside `${…}` or a subscript is not read: compute it "
                        "into a variable first"
                    )
            elif kind in ("string", "concatenation", "subscript", "translated_string"):
                self.inner(child, found)
            elif kind not in ("variable_name", "special_variable_name", "simple_expansion",
                              "number", "ansi_c_string"):  # fmt: skip
                found.doubts.append(unread(kind))

    def arithmetic(self, node: Node, start: int, end: int, found: Found) -> None:
        """The arithmetic text of `node` between two offsets: its substitutions walked, the
        variables it assigns numbers, and (once the line is read) a doubt if it reads anything
        else."""
        text, marks = masked(self, node, start, end, found)
        for target in arithmetic.targets(text):
            self.reading.assign(target, NUMBER)
        parts = [p for p in text.split(";")]

        def check(reading: Reading) -> str | None:
            def numeric(name: str) -> bool:
                if name in marks:
                    return marks[name]
                return reading.numeric(name)

            for part in parts:
                why = arithmetic.doubt(part, numeric)
                if why is not None:
                    return why
            return None

        self.reading.later(None, check)


def _plain(node: Node, pieces: Pieces, quoted: bool, found: Found) -> None:
    """A word, number or name: its text (unescaped outside quotes), or what `audit` finds in a
    word that the grammar left as one (a parameter, or code: a doubt)."""
    text = node.text.decode("utf-8", "surrogateescape")
    why = audit(node.text, quoted) if node.type == "word" else None
    if why == "$":
        pieces.computed(PARAMETER, not quoted)
    elif why is not None:
        found.doubts.append(why)
        pieces.computed(UNREADABLE, True)
    elif quoted:
        pieces.text(text, True)
    else:
        unescape_unquoted(text, pieces)
