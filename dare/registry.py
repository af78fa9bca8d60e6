"""Plug-ins registered by name (algorithms, engines): ``@REGISTRY.register("name")`` on the class, and lookup that
first imports every module of the plug-ins' package, so a new plug-in is one new file there and no edit elsewhere."""

import difflib
import importlib
import pkgutil


class Registry(dict):
    def __init__(self, kind: str, package: str):
        super().__init__()
        self.kind, self.package = kind, package

    def register(self, name: str):
        """Decorator: the class joins the registry as ``name`` (and its ``name`` attribute says so)."""
        def add(cls):
            if name in self and self[name] is not cls:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            cls.name = name
            self[name] = cls
            return cls

        return add

    def known(self) -> list[str]:
        """Every registered name, the package's modules imported first."""
        for module in pkgutil.iter_modules(importlib.import_module(self.package).__path__):
            if not module.name.startswith("_"):
                importlib.import_module(f"{self.package}.{module.name}")
        return sorted(self)

    def lookup(self, name: str):
        known = self.known()
        if name not in known:
            close = difflib.get_close_matches(name.replace("_", "-").lower(), known, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"Unknown {self.kind} {name!r}{hint}; registered: {', '.join(known)}")
        return self[name]
