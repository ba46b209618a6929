"""`glai-bench check-headers` (bench/tools/check_headers.py): the extension's C++ compiled against
a torch release's headers without installing it. Here against the installed torch's own
headers, and a known-wrong source it must refuse."""

from __future__ import annotations

import re
import shutil
import zipfile
from pathlib import Path

import pytest
from torch.utils.cpp_extension import include_paths

from bench.tools import check_headers
from glai_kernels import extension_build

# compiles, times nothing: runs beside the correctness suite's workers (conftest.py)
pytestmark = [pytest.mark.skipif(shutil.which(extension_build.cxx_compiler()) is None,
                                 reason="no C++ compiler"),
              pytest.mark.shares_cores]


def test_a_node_made_for_the_other_pointer_type_is_refused(tmp_path):
    # the eager nodes held the way the other torch releases hold autograd nodes: the build
    # error torch 2.11 gave (shared_ptr there, intrusive_ptr in 2.13), now reversed. The nodes
    # are made in eager_node.h (shared by the dense and sparse nodes): a wrong copy of it beside
    # a copy of eager_autograd.cpp is the one its quoted #include finds first.
    header = (extension_build.CSRC / "eager_node.h").read_text()
    edge = (Path(include_paths()[0]) / "torch/csrc/autograd/edge.h").read_text()
    other = ("c10::make_intrusive<Op>()" if "std::shared_ptr<Node> function" in edge
             else "std::make_shared<Op>()")
    wrong = header.replace("auto node = make_node<Op>();", f"auto node = {other};")
    assert wrong != header
    (tmp_path / "eager_node.h").write_text(wrong)
    source = tmp_path / "eager_autograd.cpp"
    source.write_text((extension_build.CSRC / "eager_autograd.cpp").read_text())
    error = check_headers.syntax_errors(source, Path(include_paths()[0]))
    assert error is not None and re.search(r"set_history|intrusive|shared_ptr|conversion", error)
    # the right header compiles: the copies in place, as the check reads them (one compile
    # less than a separate test of the checkout's own file, 8-16 s of CI)
    (tmp_path / "eager_node.h").write_text(header)
    assert check_headers.syntax_errors(source, Path(include_paths()[0])) is None


def test_the_oldest_admitted_release_comes_from_pyproject():
    text = (check_headers.ROOT / "pyproject.toml").read_text()
    lower = re.search(r'"torch>=([0-9.]+)', text).group(1)
    assert check_headers.oldest_admitted().startswith(lower)
    assert check_headers.oldest_admitted().count(".") == 2


def test_only_the_headers_are_unpacked_and_only_once(tmp_path):
    wheel = tmp_path / "torch-0.0.0-cp3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("torch/include/torch/a.h", "#pragma once\n")
        zf.writestr("torch/lib/libtorch.so", "not a header")
    include = check_headers.unpack_headers(wheel, tmp_path / "out")
    assert (include / "torch" / "a.h").is_file()
    assert not (tmp_path / "out" / "torch" / "lib").exists()
    (include / "torch" / "a.h").write_text("// kept\n")
    check_headers.unpack_headers(wheel, tmp_path / "out")  # already there: not unpacked again
    assert (include / "torch" / "a.h").read_text() == "// kept\n"


def test_a_wheel_that_cannot_be_had_fails_unless_offline_is_allowed(monkeypatch, capsys):
    def offline(version, cache):
        raise check_headers.FetchError(f"pip fetched no wheel of torch=={version}")

    monkeypatch.setattr(check_headers, "fetch_headers", offline)
    assert check_headers.main(["--torch", "2.11.0"]) == 1
    assert check_headers.main(["--torch", "2.11.0", "--skip-if-offline"]) == 0
    assert "no wheel of torch==2.11.0" in capsys.readouterr().out
