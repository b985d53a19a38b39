"""The PowerShell reader: a line parsed with tree-sitter's PowerShell grammar, each command
reported to a `Reading` as bash commands are (`bash.py` says why tree-sitter).

Literal simple commands are read and matched like bash ones (native programs get their words
as written; `Remove-Item` and its aliases are read as `rm`, their parameters matched the way
PowerShell does, without case and by any unique prefix). Doubts: `-EncodedCommand`,
`Invoke-Expression` / `iex`, `Start-Process`, the call operators `&` and `.` with a computed
target, a subexpression or backtick escape in command position, `--%`, and a line that does
not parse. Script blocks and subexpressions are read wherever they are (they may run).
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

from loopwarden.policy.commands.runs import TERMINAL, Run, Stdin
from loopwarden.policy.commands.words import PARAMETER, SUBSTITUTION, UNREADABLE, Word, computed

if TYPE_CHECKING:
    from loopwarden.policy.commands.reading import Reading

Node = Any
SCRIPT_BLOCK = "a script block"
_BACKTICK = {"0": "\0", "a": "\a", "b": "\b", "e": "\x1b", "f": "\f", "n": "\n", "r": "\r"}
_BACKTICK |= {"t": "\t", "v": "\v"}


@lru_cache(maxsize=1)
def _parser() -> Any:
    import tree_sitter
    import tree_sitter_powershell

    return tree_sitter.Parser(tree_sitter.Language(tree_sitter_powershell.language()))


def read(reading: Reading, text: str, via: str, parent: Run | None, depth: int) -> None:
    """Report every command of PowerShell `text` to `reading`; a parse error is a doubt."""
    root = _parser().parse(text.encode("utf-8", "surrogatepass")).root_node
    if root.has_error:
        reading.doubt(parent, "the line is not valid PowerShell (it does not parse)")
    _Walk(reading, via, depth).node(root, parent, TERMINAL, via)


class _Walk:
    def __init__(self, reading: Reading, via: str, depth: int) -> None:
        self.reading, self.via, self.depth = reading, via, depth

    def node(self, node: Node, parent: Run | None, stdin: Stdin, via: str) -> None:
        if node.type == "command":
            self.command(node, parent, stdin, via)
            return
        if node.type == "pipeline_chain":
            commands = [c for c in node.named_children if c.type == "command"]
            for child in node.named_children:
                piped = child in commands[1:]
                self.node(child, parent, Stdin("pipe") if piped else stdin, via)
            return
        if node.type == "stop_parsing":
            self.reading.doubt(parent, "`--%` passes the rest of the line unread")
        for child in node.named_children:
            self.node(child, parent, stdin, via)

    def command(self, node: Node, parent: Run | None, stdin: Stdin, via: str) -> None:
        name = node.child_by_field_name("command_name")
        elements = node.child_by_field_name("command_elements")
        program = self.program(name) if name is not None else None
        words = [self.element(c) for c in elements.named_children] if elements else []
        run = None
        if program is not None:
            argv = (program, *[w for w in words if w is not None])
            run = self.reading.add(
                argv, via=via or self.via, parent=parent, dialect="powershell", stdin=stdin,
                depth=self.depth,
            )  # fmt: skip
        for child in node.named_children:
            self.node(child, run or parent, stdin, via or "a script block")

    def program(self, node: Node) -> Word | None:
        """The command's program: a literal name, or computed; None for `& { … }` (the block's
        own commands are the runs)."""
        text = node.text.decode("utf-8", "surrogateescape")
        if node.type == "command_name":
            if "`" in text:
                return computed("a backtick escape")
            return Word(text)
        target = node.named_children[0] if node.named_children else node
        if target.type == "path_command_name" and target.named_children:
            target = target.named_children[0]
        if target.type == "script_block_expression":
            return None
        if target.type == "path_command_name" or target.type == "generic_token":
            return Word(text) if "`" not in text and "$" not in text else computed(PARAMETER)
        return self.value(target)  # a literal string (`& "git"`), else computed: a doubt

    def element(self, node: Node) -> Word | None:
        kind = node.type
        text = node.text.decode("utf-8", "surrogateescape")
        if kind == "command_argument_sep" or kind == "redirection":
            return None
        if kind == "generic_token":
            return Word(_unbacktick(text)) if "$" not in text else computed(PARAMETER, "", True)
        if kind == "command_parameter":
            return Word(text)
        return self.value(node)

    def value(self, node: Node) -> Word:
        """An expression used as an argument: a literal string, or computed."""
        while node.type in ("array_literal_expression", "unary_expression", "string_literal"):
            if len(node.named_children) != 1:
                return computed(PARAMETER, "", True)
            node = node.named_children[0]
        text = node.text.decode("utf-8", "surrogateescape")
        kind = node.type
        if kind == "verbatim_string_characters":
            return Word(text[1:-1].replace("''", "'"))
        if kind == "expandable_string_literal":
            inner = text[1:-1]
            if "$" in inner.replace("`$", ""):
                return computed(PARAMETER, "", False)
            return Word(_unbacktick(inner.replace('""', '"')))
        if kind in ("verbatim_here_string_characters", "expandable_here_string_literal"):
            return Word(text[2:-2].strip("\r\n")) if "$" not in text else computed(PARAMETER)
        if kind == "variable":
            return computed(PARAMETER, "", text.startswith("@"))
        if kind == "sub_expression":
            return computed(SUBSTITUTION, "", True)
        if kind == "script_block_expression":
            return computed(SCRIPT_BLOCK, "x")
        if kind in ("decimal_integer_literal", "real_literal", "integer_literal"):
            return Word(text)
        return computed(UNREADABLE, "", True)


def _unbacktick(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        ch = text[i]
        if ch == "`" and i + 1 < len(text):
            out.append(_BACKTICK.get(text[i + 1], text[i + 1]))
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


_REMOVE_ITEM = ("remove-item", "ri", "rm", "del", "erase", "rd", "rmdir")
_REMOVE_PARAMETERS = [
    "path",
    "literalpath",
    "filter",
    "include",
    "exclude",
    "recurse",
    "force",
    "credential",
    "whatif",
    "confirm",
    "stream",
    "progressaction",
    "verbose",
    "debug",
    "erroraction",
    "warningaction",
    "informationaction",
    "errorvariable",
    "warningvariable",
    "informationvariable",
    "outvariable",
    "outbuffer",
    "pipelinevariable",
]
_CANONICAL = {"recurse": "-r", "force": "-f"}
_EVALUATORS = ("invoke-expression", "iex")
_STARTERS = ("start-process", "saps", "start")


def unwrap(reading: Reading, run: Run, name: str, stdin: Stdin) -> bool:
    """PowerShell's own carriers; True if `run` was handled here (else the shared table)."""
    if name in _EVALUATORS:
        reading.doubt(run, "Invoke-Expression runs a string as code, which loopwarden cannot read")
        return True
    if name in _STARTERS:
        reading.doubt(run, "Start-Process runs a program loopwarden cannot read")
        return True
    if name in _REMOVE_ITEM:
        run.argv = (Word("rm"), *[_remove_parameter(w) for w in run.argv[1:]])
        return True
    return False


def _remove_parameter(word: Word) -> Word:
    """A `Remove-Item` parameter by its canonical `rm` spelling (`-Recurse`, `-rec` → `-r`)."""
    if word.text is None or not word.text.startswith("-") or len(word.text) < 2:
        return word
    name = word.text[1:].split(":", 1)[0].lower()
    if name in _REMOVE_PARAMETERS:
        found = [name]
    else:
        found = [p for p in _REMOVE_PARAMETERS if p.startswith(name)]
    if len(found) != 1:
        return word  # not a parameter (or an ambiguous one, which PowerShell refuses)
    return Word(_CANONICAL.get(found[0], f"--{found[0]}"))
