"""Links stay inside the repository and lead somewhere: the README is read on its own, without Sphinx."""

from __future__ import annotations

import re
import subprocess

from tests.docs._docs import ROOT, pages

LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_relative_links_resolve_inside_the_repository() -> None:
    problems = []
    for page in pages():
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL, or an anchor of the same page
            path = (page.parent / target.partition("#")[0]).resolve()
            if not path.is_relative_to(ROOT):
                problems.append(f"{page.relative_to(ROOT)}: {target} leads outside the repository")
            elif not path.exists():
                problems.append(f"{page.relative_to(ROOT)}: {target} does not exist")
    assert not problems, "\n".join(problems)


def test_no_tracked_file_names_a_path_outside_the_repository() -> None:
    # The design notes beside a developer's checkout are not in a user's clone.
    found = subprocess.run(["git", "grep", "-n", "-e", "../shared/", "--", ".", ":!tests/docs/test_links.py"],
                           cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    assert found.returncode == 1, found.stdout
