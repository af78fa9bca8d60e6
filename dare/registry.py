"""Plug-ins registered by name (algorithms, engines): ``@REGISTRY.register("name")`` on the class, and lookup that
first imports every module of the plug-ins' package, so a new plug-in is one new file there and no edit elsewhere."""

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
        if name not in self.known():
            raise ValueError(f"Unknown {self.kind} {name!r}; registered: {', '.join(self.known())}")
        return self[name]
