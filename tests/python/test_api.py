"""The package's public API, as help() shows it: every public class,
function, method and property has a docstring, and a docstring names every
parameter of its callable; create_cache_async has create_cache's
signature; ``path`` takes the daemon's and the CLI's spelling
("copy-engine") as well as Python's ("copy_engine")."""

from __future__ import annotations

import inspect
import re
import unittest
from typing import Any, Callable, List

import harness
import kvdock


def _public_members(cls: type) -> List[tuple]:
    out = []
    for name, v in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(v, property):
            out.append((name, v, None))
        elif isinstance(v, (staticmethod, classmethod)):
            out.append((name, v, v.__func__))
        elif inspect.isfunction(v):
            out.append((name, v, v))
    return out


def _unnamed_params(fn: Callable[..., Any]) -> List[str]:
    doc = fn.__doc__ or ""
    missing = []
    for p in inspect.signature(fn).parameters.values():
        if p.name in ("self", "cls") or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if not re.search(r"(?<![A-Za-z0-9_])" + re.escape(p.name) + r"(?![A-Za-z0-9_])", doc):
            missing.append(p.name)
    return missing


class TestDocs(unittest.TestCase):
    def test_every_public_member_has_a_docstring_naming_its_parameters(self):
        no_doc, unnamed = [], []
        for name in kvdock.__all__:
            obj = getattr(kvdock, name)
            if inspect.isclass(obj):
                if not obj.__doc__:
                    no_doc.append(name)
                for m, v, fn in _public_members(obj):
                    if not (v.__doc__ if fn is None else fn.__doc__):
                        no_doc.append(f"{name}.{m}")
                    elif fn is not None:
                        unnamed += [f"{name}.{m}({p})" for p in _unnamed_params(fn)]
            elif inspect.isfunction(obj):
                if not obj.__doc__:
                    no_doc.append(name)
                else:
                    unnamed += [f"{name}({p})" for p in _unnamed_params(obj)]
        self.assertEqual(no_doc, [], f"{len(no_doc)} public members without a docstring")
        self.assertEqual(unnamed, [], f"{len(unnamed)} parameters their docstring does not name")

    def test_save_and_load_say_what_they_take(self):
        for fn in (kvdock.Cache.save, kvdock.Cache.load):
            text = inspect.getdoc(fn) or ""
            for p in ("pool", "keys", "blocks", "wait_event", "path"):
                self.assertIn(p, text, f"{fn.__qualname__}: {p}")

    def test_create_cache_async_has_the_real_signature(self):
        a = inspect.signature(kvdock.Client.create_cache_async)
        s = inspect.signature(kvdock.Client.create_cache)
        self.assertEqual(list(a.parameters), list(s.parameters))
        for n, p in s.parameters.items():
            self.assertEqual(a.parameters[n].kind, p.kind, n)
            self.assertEqual(a.parameters[n].default, p.default, n)


class TestPathSpellings(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.d = harness.Daemon("cpu")
        cls.cli = kvdock.Client(cls.d.socket, name="py-api")

    @classmethod
    def tearDownClass(cls) -> None:
        cls.cli.close()
        cls.d.stop_clean()

    def test_copy_engine_in_both_spellings(self):
        a = self.cli.create_pool("py-api-a", 1, 4, 16)
        b = self.cli.create_pool("py-api-b", 1, 4, 16)
        for path in ("copy-engine", "copy_engine", "kernel", None):
            r = self.cli.transfer(a, b, [0, 1], [2, 3], path=path)
            self.assertEqual(r.rows, 2, path)
        with self.assertRaises(ValueError) as cm:
            self.cli.transfer(a, b, [0], [1], path="copy engine")
        self.assertIn("copy-engine", str(cm.exception))


if __name__ == "__main__":
    unittest.main(verbosity=2)
