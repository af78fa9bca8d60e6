"""``import dare`` registers the model families with the transformers Auto classes, without paying for it up front.

The registration itself lives in ``dare/models/__init__.py``; importing that costs seconds (torch, transformers'
modeling utilities), so ``import dare`` only arranges for it to happen once transformers' Auto machinery
(``configuration_auto``) is loaded, i.e. when someone is about to use it. It cannot happen at that very moment:
transformers may be half-way through importing itself (``modeling_layers`` imports the Auto classes mid-import) and
``dare.models`` needs those modules whole. So while it is pending, a meta-path finder wraps the loader of every
``transformers`` module and counts the ones executing on this thread; when the outermost finishes, transformers is
whole and ``dare.models`` is imported. The finder then removes itself.
"""

import importlib
import sys
import threading
import warnings

_TRIGGER = "transformers.models.auto.configuration_auto"
_state = threading.local()


def _register() -> None:
    _Finder.remove()
    try:
        importlib.import_module("dare.models")  # registers every family (if it is mid-import, its end does)
    except Exception as err:  # never break the caller's transformers import
        warnings.warn(f"DARE could not register its model families with transformers: {err!r}", stacklevel=2)


class _Loader:
    def __init__(self, loader):
        self._loader = loader

    def __getattr__(self, name):  # get_source, get_resource_reader, ... of the wrapped loader
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        _state.depth = getattr(_state, "depth", 0) + 1
        try:
            self._loader.exec_module(module)
        finally:
            _state.depth -= 1
        if _state.depth == 0 and _TRIGGER in sys.modules and _Finder.installed():
            _register()


class _Finder:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "transformers" and not name.startswith("transformers."):
            return None
        for finder in sys.meta_path:
            if isinstance(finder, _Finder) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)
                return spec
        return None

    @staticmethod
    def installed() -> bool:
        return any(isinstance(f, _Finder) for f in sys.meta_path)

    @staticmethod
    def remove() -> None:
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]


def install() -> None:
    """Register now if transformers' Auto classes are loaded already, else as soon as they are."""
    if _TRIGGER in sys.modules:
        _register()
    elif not _Finder.installed():
        sys.meta_path.insert(0, _Finder())
