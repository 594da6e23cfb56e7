"""nsl.scaling.code: the runner's checkout shipped to the nodes as one content-named archive
(docs/guide/pods.md, issue #53 "workers run the runner's exact code"). A small git checkout built
here: what git would commit goes (untracked files too), what it ignores or lost does not; the same
files give the same archive, a changed one a new name; a worker's fetch unpacks it byte for byte,
modes and links kept, and refuses an archive that is not what its name says."""

import os
import subprocess
import tarfile

import pytest

from nsl.errors import NslError
from nsl.scaling import code


def git(repo, *args):
  subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                 env=dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                          GIT_COMMITTER_EMAIL="t@t"))


@pytest.fixture
def checkout(tmp_path):
  repo = tmp_path / "repo"
  (repo / "nsl").mkdir(parents=True)
  (repo / "configs").mkdir()
  (repo / "nsl" / "__init__.py").write_text("")
  (repo / "configs" / "tiny.py").write_text("def get_config(): pass\n")
  (repo / "run.sh").write_text("#!/bin/sh\necho hi\n")
  os.chmod(repo / "run.sh", 0o755)
  (repo / "gone.py").write_text("deleted in the work tree\n")
  (repo / ".gitignore").write_text("/data/\n*.pyc\n")
  git(repo, "init", "-q")
  git(repo, "add", ".")
  git(repo, "commit", "-q", "-m", "x")
  os.remove(repo / "gone.py")
  (repo / "data").mkdir()
  (repo / "data" / "big.bin").write_bytes(b"\0" * 1000)  # ignored
  (repo / "nsl" / "x.pyc").write_bytes(b"")  # ignored
  (repo / "new.py").write_text("untracked, not ignored\n")
  os.symlink("configs/tiny.py", repo / "link.py")
  return repo


def test_pack_ships_what_git_would_commit_once_by_content(checkout, tmp_path):
  assert code.files(str(checkout)) == [".gitignore", "configs/tiny.py", "link.py", "new.py", "nsl/__init__.py",
                                       "run.sh"]
  root = tmp_path / "grid"
  uri = code.pack(str(root), str(checkout))
  assert os.path.dirname(uri) == str(root / ".code") and uri.endswith(".tar.gz")
  stamp = os.stat(uri).st_mtime_ns
  os.utime(checkout / "new.py", (1, 1))  # a touched file is the same code
  assert code.pack(str(root), str(checkout)) == uri and os.stat(uri).st_mtime_ns == stamp  # not rewritten
  (checkout / "new.py").write_text("changed\n")
  changed = code.pack(str(root), str(checkout))
  assert changed != uri and sorted(os.listdir(root / ".code")) == sorted([os.path.basename(uri),
                                                                           os.path.basename(changed)])

  dest = tmp_path / "node"
  code.fetch(changed, str(dest))
  assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if not p.is_dir()) == code.files(str(checkout))
  assert (dest / "new.py").read_text() == "changed\n" and os.access(dest / "run.sh", os.X_OK)
  assert os.readlink(dest / "link.py") == "configs/tiny.py" and not os.access(dest / "new.py", os.X_OK)


def test_fetch_refuses_an_archive_that_is_not_what_its_name_says(checkout, tmp_path):
  uri = code.pack(str(tmp_path / "grid"), str(checkout))
  with tarfile.open(uri, "w:gz") as tar:  # the same name over other contents (a partial upload)
    tar.add(str(checkout / "run.sh"), arcname="run.sh")
  with pytest.raises(NslError, match="does not hold what its name says"):
    code.fetch(uri, str(tmp_path / "node"))
  with pytest.raises(NslError, match="cannot fetch the cell's code"):
    code.fetch(str(tmp_path / "grid" / ".code" / "0123456789abcdef.tar.gz"), str(tmp_path / "node2"))


def test_outside_a_checkout_the_installed_package_is_shipped(tmp_path):
  site = tmp_path / "site-packages"
  (site / "nsl" / "scaling" / "__pycache__").mkdir(parents=True)
  (site / "nsl" / "__init__.py").write_text("")
  (site / "nsl" / "scaling" / "grid.py").write_text("")
  (site / "nsl" / "scaling" / "__pycache__" / "grid.cpython-311.pyc").write_bytes(b"")
  (site / "other_package.py").write_text("")
  assert code.files(str(site)) == ["nsl/__init__.py", "nsl/scaling/grid.py"]
  with pytest.raises(NslError, match="neither a git checkout"):
    code.files(str(tmp_path / "empty"))


def test_a_checkout_with_a_data_folder_git_does_not_ignore_is_refused(checkout, monkeypatch):
  monkeypatch.setattr(code, "MAX_BYTES", 1000)
  (checkout / "runs").mkdir()
  (checkout / "runs" / "weights.bin").write_bytes(b"\1" * 2000)
  with pytest.raises(NslError, match=r"largest: runs/weights.bin.*add data and run folders to .gitignore"):
    code.pack(str(checkout.parent / "grid"), str(checkout))
