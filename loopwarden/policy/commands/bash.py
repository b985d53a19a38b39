"""The bash reader: a command line parsed with tree-sitter's Bash grammar, and every construct in
it either read or doubted — a closed world.

Why tree-sitter: a shell is a programming language, and a hand-written splitter reads it the
way its author imagined, not the way bash does. tree-sitter-bash is the grammar editors and code
hosts use for bash, shipped as prebuilt wheels; it parses in microseconds, never executes
anything, and always returns a tree (with ERROR nodes where the text is not bash: a doubt).

Closed world: `STATEMENTS` below and `evaluation.WORDS` are every node type the walk reads,
each with what it does (`INNER`: the parts of them it reads); a node of any other type is a
doubt, and so is anything the grammar let through that bash reads differently: a keyword read
as a word (`time {`, `! {`, `coproc {`, `time if`), a substitution the grammar left inside a
word (backquotes in `${y:-…}`, `$(…)` in `${x#…}`, in an unquoted here-document), a `${…}` form
`expansions.py` does not model, text the grammar passed over. Words are evaluated as bash
passes them (`evaluation.py`): quotes removed, escapes and ANSI-C quotes decoded, anything
computed marked so. Arithmetic (`arithmetic.py`) and the builtins that take variable names
(`variables.py`) are checked for what bash would evaluate as code.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

from loopwarden.policy.commands import configs, evaluation, variables
from loopwarden.policy.commands.evaluation import WORDS, Evaluator, Found, unread
from loopwarden.policy.commands.reading import KEYS, NUMBER, PATH
from loopwarden.policy.commands.runs import TERMINAL, Run, Stdin
from loopwarden.policy.commands.words import BRACES, SUBSTITUTION, Pieces, Word

if TYPE_CHECKING:
    from collections.abc import Callable

    from loopwarden.policy.commands.reading import Reading

Node = Any  # tree_sitter.Node (the module is imported on first use only)


@lru_cache(maxsize=1)
def _parser() -> Any:
    import tree_sitter
    import tree_sitter_bash

    return tree_sitter.Parser(tree_sitter.Language(tree_sitter_bash.language()))


def read(reading: Reading, text: str, via: str, parent: Run | None, depth: int) -> None:
    """Report every command of bash `text` to `reading`; what is not read is a doubt."""
    data = text.encode("utf-8", "surrogatepass")
    root = _parser().parse(data).root_node
    if root.has_error:
        reading.doubt(parent, "the line is not valid bash (it does not parse)")
    elif _skipped(root, data):
        reading.doubt(
            parent,
            "the grammar dropped a word bash reads (text between the words it parsed): "
            "write the line more plainly",
        )
    _Walk(reading, via, depth, data).node(root, parent, TERMINAL)


_ATOMIC = frozenset(
    {"heredoc_body", "string", "raw_string", "ansi_c_string", "translated_string", "comment",
     "word", "number", "heredoc_start", "heredoc_end"}
)  # fmt: skip


def _skipped(root: Node, data: bytes) -> bool:
    """Whether text outside every token of the tree is more than blanks and line
    continuations: the grammar dropped a word, so the tree is not what bash reads. The one
    word it is known to drop, a `-` before a here-document (`python3 - <<EOF`), is put back by
    the walk (`_dash_before`)."""
    spans = []
    cursor = root.walk()
    while True:  # every token, in order, with a cursor (no node lists are built)
        node = cursor.node
        if node.type in _ATOMIC or not cursor.goto_first_child():
            spans.append((node.start_byte, node.end_byte))
            while not cursor.goto_next_sibling():
                if not cursor.goto_parent():
                    break
            else:
                continue
            break
    end = 0
    for start, stop in sorted(spans):
        if start > end:
            gap = data[end:start].replace(b"\\\n", b"").strip()
            if gap and not (set(gap.split()) == {b"-"} and data[start : start + 2] == b"<<"):
                return True
        end = max(end, stop)
    return bool(data[end:].replace(b"\\\n", b"").strip())


_COMPOUND = {
    "{": "a `{ }` group", "(": "a `( )` subshell", "if": "an `if` block",
    "while": "a `while` loop", "until": "an `until` loop", "for": "a `for` loop",
    "select": "a `select` loop", "case": "a `case` block", "[[": "a `[[ ]]` test",
    "((": "a `(( ))` command", "!": "`!`", "function": "a function definition",
    "coproc": "`coproc`", "time": "`time`",
}  # fmt: skip


class _Walk:
    def __init__(self, reading: Reading, via: str, depth: int, data: bytes) -> None:
        self.reading, self.via, self.depth, self.data = reading, via, depth, data
        self.words = Evaluator(reading, data)

    # --- statements -------------------------------------------------------------------

    def node(self, node: Node, parent: Run | None, stdin: Stdin, via: str = "") -> None:
        handler = _STATEMENTS.get(node.type)
        if handler is not None:
            handler(self, node, parent, stdin, via)
        elif node.type != "comment":
            self.reading.doubt(parent, unread(node.type))

    def block(self, node: Node, parent: Run | None, stdin: Stdin, via: str) -> None:
        for child in node.named_children:
            self.node(child, parent, stdin, via)

    def error(self, node: Node, parent: Run | None, stdin: Stdin, via: str) -> None:
        """Text the grammar could not parse (the line is already a doubt): the commands it
        could still find are read, for what they tell the operator."""
        for child in node.named_children:
            if child.type in _STATEMENTS:
                self.node(child, parent, stdin, via)

    def compound(self, node: Node, parent: Run | None, stdin: Stdin, via: str) -> None:
        if node.children and node.children[0].type == "((":
            found = Found()
            self.words.arithmetic(
                node, node.children[0].end_byte, node.children[-1].start_byte, found
            )
            self.settle(found, None, parent)
            return
        self.block(node, parent, stdin, via)

    def pipeline(self, node: Node, parent: Run | None, stdin: Stdin, via: str) -> None:
        for n, child in enumerate(c for c in node.named_children if c.type != "comment"):
            self.node(child, parent, stdin if n == 0 else Stdin("pipe"), via)

    def function(self, node: Node, parent: Run | None, stdin: Stdin, via: str) -> None:
        name = node.child_by_field_name("name")
        if name is not None:
            self.reading.functions.add(name.text.decode(errors="replace"))
        for child in node.named_children:
            if child is name or (name is not None and child.id == name.id):
                continue
            if child.type in _REDIRECTS:
                self.redirect(child, parent)
            else:
                self.node(child, parent, stdin, "a function body")

    def substitution(self, node: Node, parent: Run | None, via: str) -> None:
        """The statements of `$( … )`, backquotes, `<( … )`, `>( … )`."""
        for child in node.named_children:
            self.node(child, parent, TERMINAL, via)

    def redirected(self, node: Node, parent: Run | None, stdin: Stdin, via: str) -> None:
        body = node.child_by_field_name("body")
        redirects = [c for c in node.named_children if body is None or c.id != body.id]
        given = stdin
        for redirect in redirects:
            given = _stdin_of(self, redirect) or given
        if body is not None:
            extra = _dash_before(self, body, redirects)
            if extra and body.type == "command":
                self.command(body, parent, given, via, extra)
            else:
                self.node(body, parent, given, via)
        for redirect in redirects:
            self.redirect(redirect, parent)

    def command(
        self,
        node: Node,
        parent: Run | None,
        stdin: Stdin,
        via: str,
        extra: tuple[Word, ...] = (),
    ) -> None:
        found = Found()
        name = node.child_by_field_name("name")
        words: list[Node] = []
        redirects: list[Node] = []
        env: list[Word] = []
        timed: list[Node] = []  # `time ( … )`: the grammar puts the subshell in the command
        for child in node.named_children:
            kind = child.type
            if kind == "variable_assignment":
                self.assignment(child, parent, found)
                value = child.child_by_field_name("value")
                if value is not None and value.type in WORDS:
                    env.append(self.words.word(value, Found()))
            elif kind in _REDIRECTS:
                redirects.append(child)
            elif kind == "comment":
                continue
            elif kind == "command_name" or kind in WORDS:
                words.append(child)
            elif kind == "subshell" and name is not None and name.text == b"time" and not words[1:]:
                timed.append(child)
            else:
                found.doubts.append(unread(kind))
        run = None
        if name is not None:
            argv = (*self.words.arguments(words, found), *extra)
            keywords = _keywords(node, argv)
            own = stdin
            for redirect in redirects:
                own = _stdin_of(self, redirect) or own
            run = self.reading.add(
                argv, via=via or self.via, parent=parent, dialect="bash", stdin=own,
                depth=self.depth, doubts=keywords, env=tuple(env),
            )  # fmt: skip
        self.settle(found, run, parent)
        for statement in timed:
            self.node(statement, run or parent, stdin, "time")
        for redirect in redirects:
            self.redirect(redirect, run or parent)

    def settle(self, found: Found, run: Run | None, parent: Run | None) -> None:
        """Attach what reading words found: doubts, and the code they hold, run by `run`."""
        for why in found.doubts:
            self.reading.doubt(run or parent, why)
        for code, via in found.code:
            self.substitution(code, run or parent, via)

    def assignment(self, node: Node, parent: Run | None, found: Found, flags: str = "") -> None:
        target = node.child_by_field_name("name")
        value = node.child_by_field_name("value")
        if target is None:
            found.doubts.append(unread("variable_assignment"))
            return
        name = target.text.decode(errors="replace")
        if target.type == "subscript":
            base = target.child_by_field_name("name")
            name = base.text.decode(errors="replace") if base is not None else name
            index = target.child_by_field_name("index")
            if index is not None:
                self.words.inner(index, found)
                evaluation.subscript_check(
                    self.reading, parent, name, evaluation.text(self.words, index), found
                )
        if "A" in flags:
            self.reading.assoc.add(name)
        if "i" in flags:
            self.reading.integers.add(name)
        if value is None:
            self.reading.assign(name, "")
            variables.assigned(self.reading, parent, name, Word(""))
            return
        if value.type == "array":
            self.array(name, value, parent, found)
            return
        word = self.words.word(value, found)
        numeric = evaluation.numeric(self.words, value)
        if word.text is None and not numeric and evaluation.path(value):
            self.reading.assign(name, PATH)
            variables.assigned(self.reading, parent, name, word)
            return
        self.reading.assign(name, NUMBER if numeric and word.text is None else word.text)
        if word.text is None and word.params is not None and word.template == "\0":
            self.reading.assign(name, "\x02" + word.params[0])
        if "n" in flags:
            variables.name_doubt(self.reading, parent, word)
        variables.assigned(self.reading, parent, name, word)

    def array(self, name: str, node: Node, parent: Run | None, found: Found) -> None:
        """`name=( … )`: each element a value of `name`; `[i]=v` subscripts are arithmetic for
        an indexed array."""
        self.reading.assign(name, "")
        for element in node.named_children:
            parts = element.children if element.type == "concatenation" else []
            if parts and parts[0].type == "word" and parts[0].text == b"[":
                close = next((n for n, p in enumerate(parts) if p.text == b"]"), None)
                if close is None:
                    found.doubts.append(unread("array"))
                    continue
                for part in parts[1:close]:
                    self.words.inner(part, found)
                index = self.data[parts[0].end_byte : parts[close].start_byte].decode(
                    errors="replace"
                )
                evaluation.subscript_check(self.reading, parent, name, index, found)
                pieces = Pieces()
                for part in parts[close + 1 :]:
                    self.words.part(part, pieces, False, found)
                value = pieces.word()
                text = value.text[1:] if value.text is not None and value.text[:1] == "=" else None
                self.reading.assign(name, text)
            else:
                word = self.words.word(element, found)
                self.reading.assign(
                    name, NUMBER if evaluation.numeric(self.words, element) else word.text
                )

    def assignments(self, node: Node, parent: Run | None, stdin: Stdin, via: str) -> None:
        found = Found()
        if node.type == "variable_assignment":
            self.assignment(node, parent, found)
        else:
            for child in node.named_children:
                if child.type == "variable_assignment":
                    self.assignment(child, parent, found)
                elif child.type != "comment":
                    found.doubts.append(unread(child.type))
        self.settle(found, None, parent)

    def declaration(self, node: Node, parent: Run | None, stdin: Stdin, via: str) -> None:
        """`declare`, `typeset`, `local`, `export`, `readonly` (a builtin, not a run)."""
        found = Found()
        words: list[Word] = []
        assigned: list[Node] = []
        for child in node.named_children:
            if child.type == "variable_assignment":
                assigned.append(child)
                target = child.child_by_field_name("name")
                words.append(Word(target.text.decode(errors="replace") if target else ""))
            elif child.type == "variable_name":
                words.append(Word(child.text.decode(errors="replace")))
            elif child.type in WORDS:
                words.append(self.words.word(child, found))
            elif child.type != "comment":
                found.doubts.append(unread(child.type))
        flags = variables.declare(self.reading, parent, words, assign=True)
        for child in assigned:
            self.assignment(child, parent, found, flags)
        self.settle(found, None, parent)

    def unset(self, node: Node, parent: Run | None, stdin: Stdin, via: str) -> None:
        found = Found()
        functions = False
        for child in node.named_children:
            if child.type == "variable_name":
                continue
            if child.type not in WORDS:
                found.doubts.append(unread(child.type))
                continue
            word = self.words.word(child, found)
            if word.text is not None and word.text.startswith("-"):
                functions = functions or "f" in word.text
            elif not functions:
                variables.name_doubt(self.reading, parent, word)
        self.settle(found, None, parent)

    def test(self, node: Node, parent: Run | None, stdin: Stdin, via: str) -> None:
        """`[[ … ]]` and `[ … ]`: operands are words; `-v` takes a variable name, and in
        `[[ ]]` the operands of `-eq`, `-lt`, … are arithmetic."""
        found = Found()
        keyword = node.children[0].type if node.children else "[["
        for child in node.named_children:
            self.condition(child, keyword == "[[", parent, found)
        self.settle(found, None, parent)

    def condition(self, node: Node, arithmetic_: bool, parent: Run | None, found: Found) -> None:
        kind = node.type
        if kind in ("binary_expression", "unary_expression", "parenthesized_expression"):
            operator = next(
                (c.text.decode() for c in node.children if c.type == "test_operator"), ""
            )
            operands = [c for c in node.named_children if c.type != "test_operator"]
            for operand in operands:
                if operand.type in ("binary_expression", "unary_expression",
                                    "parenthesized_expression"):  # fmt: skip
                    self.condition(operand, arithmetic_, parent, found)
                    continue
                if operand.type == "regex":
                    why = evaluation.audit(operand.text, quoted=False)
                    if why is not None and why != "$":
                        found.doubts.append(why)
                    continue
                if operand.type not in WORDS:
                    found.doubts.append(unread(operand.type))
                    continue
                word = self.words.word(operand, found)
                if operator == "-v":
                    variables.name_doubt(self.reading, parent, word)
                elif arithmetic_ and operator in ("-eq", "-ne", "-lt", "-le", "-gt", "-ge"):
                    evaluation.arithmetic_word(self.words, operand, word, parent, found)
        elif kind in WORDS:
            self.words.word(node, found)
        elif kind != "comment":
            found.doubts.append(unread(kind))

    def loop(self, node: Node, parent: Run | None, stdin: Stdin, via: str) -> None:
        """`for NAME in WORDS; do …; done` and `select`: NAME takes each word."""
        found = Found()
        variable = node.child_by_field_name("variable")
        values = node.children_by_field_name("value")
        name = variable.text.decode(errors="replace") if variable is not None else ""
        if not values:
            self.reading.assign(name, None)  # the positional parameters
        for value in values:
            word = self.words.word(value, found)
            numeric = evaluation.numeric(self.words, value) or (
                word.kind == BRACES and evaluation.numeric_braces(value)
            )
            keys = evaluation.keys_of(value)
            if keys is not None:
                self.reading.assign(name, KEYS + keys)  # `"${!arr[@]}"`: its subscripts
            elif word.text is None and word.params is not None and word.template == "\0":
                self.reading.assign(name, "\x02" + word.params[0])
            else:
                self.reading.assign(name, NUMBER if numeric else word.text)
        self.settle(found, None, parent)
        for child in node.named_children:
            if child.type in ("do_group", "compound_statement") or (
                child.type not in WORDS
                and child.type != "comment"
                and (variable is None or child.id != variable.id)
            ):
                self.node(child, parent, stdin, via)

    def c_loop(self, node: Node, parent: Run | None, stdin: Stdin, via: str) -> None:
        found = Found()
        opening = next((c for c in node.children if c.type == "(("), None)
        closing = next((c for c in node.children if c.type == "))"), None)
        if opening is None or closing is None:
            found.doubts.append(unread("c_style_for_statement"))
        else:
            self.words.arithmetic(node, opening.end_byte, closing.start_byte, found)
        self.settle(found, None, parent)
        for child in node.named_children:
            if child.type in ("do_group", "compound_statement"):
                self.node(child, parent, stdin, via)

    def case(self, node: Node, parent: Run | None, stdin: Stdin, via: str) -> None:
        found = Found()
        for child in node.named_children:
            if child.type == "case_item":
                for part in child.named_children:
                    if part.type in WORDS:
                        self.words.word(part, found)
                    else:
                        self.node(part, parent, stdin, via)
            elif child.type in WORDS:
                self.words.word(child, found)
            elif child.type != "comment":
                found.doubts.append(unread(child.type))
        self.settle(found, None, parent)

    def redirect(self, node: Node, parent: Run | None) -> None:
        """The words of a redirection (a `>(…)` target runs), a here-document's body (its
        substitutions run unless its delimiter is quoted) and what follows its start."""
        found = Found()
        kind = node.type
        if kind == "heredoc_redirect":
            start = next((c for c in node.children if c.type == "heredoc_start"), None)
            quoted = start is not None and any(ch in start.text for ch in b"'\"\\")
            for child in node.named_children:
                if child.type == "heredoc_body":
                    if not quoted:
                        self.heredoc(child, found)
                elif child.type in ("heredoc_start", "heredoc_end"):
                    continue
                elif child.type in _REDIRECTS:
                    self.redirect(child, parent)
                elif child.type == "pipeline":
                    for part in child.named_children:
                        self.node(part, parent, Stdin("pipe"), "")
                else:
                    self.node(child, parent, TERMINAL, "")
        else:
            operator = next((c.type for c in node.children if not c.is_named), "")
            for child in node.named_children:
                if child.type in WORDS:
                    word = self.words.word(child, found)
                    if kind == "file_redirect" and operator in _WRITES:
                        configs.writes(self.reading, parent, word)
                elif child.type not in ("file_descriptor", "comment"):
                    found.doubts.append(unread(child.type))
        self.settle(found, None, parent) if not found.code else self._code(found, parent)

    def _code(self, found: Found, parent: Run | None) -> None:
        for why in found.doubts:
            self.reading.doubt(parent, why)
        for code, _ in found.code:
            self.substitution(code, parent, "a redirection")

    def heredoc(self, body: Node, found: Found) -> None:
        """An unquoted here-document's body: its expansions and substitutions, as in a
        double-quoted word (a backquote there is not parsed by the grammar: a doubt)."""
        text = bytearray(body.text)
        for child in body.named_children:
            if child.type != "heredoc_content":
                self.words.part(child, Pieces(), True, found)
                start, end = child.start_byte - body.start_byte, child.end_byte - body.start_byte
                text[start:end] = b" " * (end - start)
        why = evaluation.audit(bytes(text), quoted=True)
        if why is not None and why != "$":
            found.doubts.append(
                "an unquoted here-document holds a substitution loopwarden does not read (a "
                "backquote, or one inside `${…}`): quote its delimiter (<<'EOF') or compute the "
                "value before"
            )


# --- the constructs read, by node type ------------------------------------------------------

_REDIRECTS = frozenset({"file_redirect", "heredoc_redirect", "herestring_redirect"})
_WRITES = frozenset({">", ">>", ">|", "&>", "&>>", "<>", ">&"})

_STATEMENTS: dict[str, Callable[[_Walk, Node, Run | None, Stdin, str], None]] = {
    "program": _Walk.block,
    "list": _Walk.block,
    "do_group": _Walk.block,
    "if_statement": _Walk.block,
    "elif_clause": _Walk.block,
    "else_clause": _Walk.block,
    "while_statement": _Walk.block,
    "subshell": _Walk.block,
    "negated_command": _Walk.block,
    "compound_statement": _Walk.compound,
    "pipeline": _Walk.pipeline,
    "redirected_statement": _Walk.redirected,
    "command": _Walk.command,
    "function_definition": _Walk.function,
    "variable_assignment": _Walk.assignments,
    "variable_assignments": _Walk.assignments,
    "declaration_command": _Walk.declaration,
    "unset_command": _Walk.unset,
    "test_command": _Walk.test,
    "for_statement": _Walk.loop,
    "c_style_for_statement": _Walk.c_loop,
    "case_statement": _Walk.case,
    "command_substitution": lambda w, n, p, s, v: w.substitution(n, p, "$(…)"),
    "ERROR": _Walk.error,
}
STATEMENTS = frozenset(_STATEMENTS)
"""Every statement node the walk reads: lists, pipelines, subshells, groups, `if`/`while`/
`until`/`for`/`select`/C-style `for`/`case`, function definitions, commands, assignments,
declarations, `unset`, `[[ … ]]` and `[ … ]`, `(( … ))`, redirected statements."""

INNER = frozenset(
    {"array", "binary_expression", "unary_expression", "parenthesized_expression",
     "postfix_expression", "ternary_expression", "test_operator", "regex", "subscript",
     "string_content", "case_item", "comment", "file_descriptor", "file_redirect",
     "heredoc_redirect", "herestring_redirect", "heredoc_start", "heredoc_body",
     "heredoc_content", "heredoc_end"}
)  # fmt: skip
"""Node types read as parts of the constructs above: an assignment's array; the expressions of
`[[ … ]]` (their operands words, `-v` names and `-eq` arithmetic); arithmetic, read from its
text (`arithmetic.py`); a `${…}`'s subscript and patterns; redirections and here-documents;
`case` items; comments. `STATEMENTS | evaluation.WORDS | INNER` is every named node type of
the grammar
(tests/test_closed_world.py holds it so): any node met elsewhere than where it is read is a
doubt."""


# --- helpers --------------------------------------------------------------------------------


def _keywords(node: Node, argv: tuple[Word, ...]) -> tuple[str, ...]:
    """A reserved word where the grammar reads a command: `time {`, `! {`, `coproc {`."""
    words = [w.text for w in argv]
    program = words[0] if words else None
    if program in ("time", "coproc"):
        rest = words[1:]
        while rest and rest[0] in ("-p", "--"):
            rest = rest[1:]
        if program == "coproc" and len(rest) > 1 and rest[1] in _COMPOUND:
            rest = rest[1:]  # coproc NAME { … }
        if rest and rest[0] in _COMPOUND:
            return (
                f"`{program}` before {_COMPOUND[rest[0]]} is not read: run the command without "
                f"`{program}`",
            )
    elif program in _COMPOUND:
        parent = node.parent
        if parent is not None and parent.type == "negated_command":
            return (f"`!` before {_COMPOUND[program]} is not read: run the command without `!`",)
    return ()


def _dash_before(walk: _Walk, body: Node, redirects: list[Node]) -> tuple[Word, ...]:
    """The `-` words the grammar drops before a here-document (`python3 - <<EOF`,
    `git commit -F - <<'MSG'`), to put back at the end of the command."""
    heredoc = next((r for r in redirects if r.type == "heredoc_redirect"), None)
    if heredoc is None or body.end_byte >= heredoc.start_byte:
        return ()
    gap = walk.data[body.end_byte : heredoc.start_byte].replace(b"\\\n", b"").split()
    return tuple(Word("-") for word in gap if word == b"-")


def _stdin_of(walk: _Walk, redirect: Node) -> Stdin | None:
    """The standard input a redirection gives, if it gives one."""
    kind = redirect.type
    if kind == "heredoc_redirect":
        return Stdin("heredoc", _heredoc(redirect))
    if kind == "herestring_redirect":
        target = [c for c in redirect.named_children]
        word = walk.words.arguments(target, Found()) if target else []
        text = word[0] if word else Word("")
        return Stdin("herestring", Word(text.text + "\n") if text.text is not None else text)
    if kind == "file_redirect":
        descriptor = next((c for c in redirect.children if c.type == "file_descriptor"), None)
        if descriptor is not None and descriptor.text != b"0":
            return None
        operator = next((c.type for c in redirect.children if not c.is_named), "")
        if operator in ("<", "<>"):
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
    if not quoted and (
        any(c.type != "heredoc_content" for c in body.named_children) or "`" in text
    ):
        return Word(None, SUBSTITUTION)
    if any(c.type == "<<-" for c in redirect.children):
        text = "\n".join(line.lstrip("\t") for line in text.split("\n"))
    return Word(text if quoted else unescape_heredoc(text))


def unescape_heredoc(text: str) -> str:
    """An unquoted here-document's text: `\\$`, backquote, `\\\\` and line continuations."""
    return text.replace("\\\n", "").replace("\\$", "$").replace("\\`", "`").replace("\\\\", "\\")
