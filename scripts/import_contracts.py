"""Import-linter contract types of our own, registered in pyproject.toml's [tool.importlinter] contract_types.

`forbidden_except`: a forbidden contract whose sources are every module under a package *but* the ones named as
exempt. The stock forbidden contract takes a list of sources, so a module added later is outside it until someone
remembers to list it; written by rule, a new module is inside it the moment it exists.
"""

from __future__ import annotations

from grimp import ImportGraph
from importlinter.contracts.forbidden import ForbiddenContract
from importlinter.domain import fields
from importlinter.domain.contract import ContractCheck
from importlinter.domain.helpers import module_expressions_to_modules
from importlinter.domain.imports import ModuleExpression


class ForbiddenExceptContract(ForbiddenContract):
    """Every module in `source_modules` (taken as packages) except `exempt_modules` never imports `forbidden_modules`,
    directly or through any chain, exempt modules included (a view that imports a page's ui file imports Streamlit).
    """

    type_name = "forbidden_except"

    exempt_modules = fields.SetField(subfield=fields.ModuleExpressionField())

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        packages = module_expressions_to_modules(graph, self.source_modules, as_packages=True)  # type: ignore[arg-type]
        exempt = module_expressions_to_modules(graph, self.exempt_modules)  # type: ignore[arg-type]
        covered = sorted(module.name for module in packages - exempt)
        # The parent checks each listed module as itself, not as a package: a package's exempt children stay exempt.
        # (import-linter's fields are descriptors on the class and plain values on the instance.)
        self.source_modules = {ModuleExpression(name) for name in covered}  # type: ignore[assignment]
        self.as_packages = False  # type: ignore[assignment]
        return super().check(graph, verbose)
