"""Hydra plugin module: registers the config schema for every Hydra compose.

Hydra imports every module under the ``hydra_plugins`` namespace package when it scans
for plugins, and DVC triggers that scan before composing ``params.yaml`` on
``dvc exp run`` (``.dvc/config``: ``hydra.plugins_path``). Registering the schema here
(an import-time side effect, on purpose and only here) is what lets DVC's compose reject
``-S sampling.temperature=abc`` with the key's name.
"""

from hydra.plugins.search_path_plugin import SearchPathPlugin

from pipeline.core.conf_schema import register_configs

register_configs()


class PipelineSchemaSearchPath(SearchPathPlugin):
    """No-op search-path plugin: gives Hydra's scanner a Plugin class in this module."""

    def manipulate_search_path(self, search_path) -> None:  # noqa: D401 - Hydra API
        return None
