"""Every ```python block in README.md and docs/*.md runs (or, if marked, compiles),
and so does every ```bash block of docs/http.md (its curl examples, against a
live ``zmesh http``).

A block is a whole program: it runs as its own script (``__main__``) against
two loopback agents (``ZMESH_AGENTS``), and must exit 0 within its deadline.
A block that is a test module (it imports pytest and defines ``test_*``)
runs under pytest. A fragment (a signature, an excerpt with ``...``) is
marked in the markdown with an HTML comment on the line before the fence::

    <!-- no-run -->
    ```python
    svc = await Embedder.options(replicas=3).as_service()
    ```

and is only compiled (top-level ``await`` allowed). Keep those rare: a
block a reader can paste and run is the point.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from zmesh.testing import local_cluster

from _helpers import end_child, read_line, run_python

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NO_RUN = "<!-- no-run -->"
FENCE = re.compile(r"^```python\n(.*?)^```", re.M | re.S)
SHELL_FENCE = re.compile(r"^```bash\n(.*?)^```", re.M | re.S)
HTTP_PAGE = ROOT / "docs" / "http.md"
EXAMPLE = ROOT / "examples" / "http_tokens.py"


@dataclass(frozen=True)
class Block:
    """One ```python block: where it is, its code, and whether it runs."""

    page: Path
    line: int
    code: str
    run: bool

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path, fence: re.Pattern[str] = FENCE) -> list[Block]:
    """The ```python blocks (or those ``fence`` finds) of ``page``, in order."""
    text = page.read_text()
    found = []
    for m in fence.finditer(text):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        line = text.count("\n", 0, m.start()) + 1
        found.append(Block(page, line, m.group(1), run=before != NO_RUN))
    return found


ALL = [b for page in PAGES for b in blocks(page)]


@pytest.fixture(scope="module")
def two_hosts() -> Iterator[str]:
    """``ZMESH_AGENTS`` for two loopback agents (as two hosts)."""
    with local_cluster(2) as agents:
        yield ",".join(a.control for a in agents)


def test_the_pages_have_blocks() -> None:
    assert len(ALL) > 10 and sum(b.run for b in ALL) > len(ALL) / 2


@pytest.mark.parametrize("block", ALL, ids=lambda b: b.id)
def test_block_compiles(block: Block) -> None:
    try:
        compile(block.code, block.id, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    except SyntaxError as exc:
        pytest.fail(f"{block.id}: {exc}")


@pytest.mark.slow
@pytest.mark.parametrize("block", [b for b in ALL if b.run], ids=lambda b: b.id)
def test_block_runs(block: Block, two_hosts: str, tmp_path: Path) -> None:
    name = re.sub(r"\W", "_", block.id.removesuffix(".md").split("/")[-1]).lower()
    script = tmp_path / f"test_{name}.py"
    script.write_text(block.code)
    is_test = "import pytest" in block.code and re.search(r"^def test_", block.code, re.M)
    args = (
        ["-m", "pytest", "-q", "-p", "no:cacheprovider", str(script)] if is_test else [str(script)]
    )
    # A test module starts its own agents (local_cluster); a program uses two_hosts.
    env = {} if is_test else {"ZMESH_AGENTS": two_hosts}
    done = run_python(args, 120, env=env, cwd=str(tmp_path))
    assert done.returncode == 0, f"{block.id} failed:\n{done.stdout}\n{done.stderr}"


SHELL = [b for b in blocks(HTTP_PAGE, SHELL_FENCE) if b.run]


@pytest.fixture(scope="module")
def gateway(two_hosts: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """``URL`` and ``TOKEN_FILE`` of a ``zmesh http`` serving the example's "writer"."""
    root = tmp_path_factory.mktemp("http-doc")
    env = {"ZMESH_AGENTS": two_hosts}
    done = run_python([str(EXAMPLE), "up"], 120, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    popen = subprocess.Popen(
        [sys.executable, "-m", "zmesh", "http", "--agents", two_hosts, "--bind", "127.0.0.1:0",
         "--token-file", str(root / "token"), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        ready = json.loads(read_line(popen, 60))
        yield {"URL": ready["url"], "TOKEN_FILE": ready["token_file"]}
    finally:
        popen.terminate()
        end_child(popen)
        run_python([str(EXAMPLE), "down"], 60, env=env)


def test_the_http_page_has_curl_blocks() -> None:
    assert len(SHELL) >= 4 and all("curl" in b.code for b in SHELL)


@pytest.mark.slow
@pytest.mark.parametrize("block", SHELL, ids=lambda b: b.id)
def test_shell_block_runs(block: Block, gateway: dict[str, str], tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.code], capture_output=True, text=True,
        timeout=60, env={"PATH": "/usr/local/bin:/usr/bin:/bin", **gateway}, cwd=str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, f"{block.id} failed:\n{done.stdout}\n{done.stderr}"
