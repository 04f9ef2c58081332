"""Named configs (`orchestra train --config demo`) and the default tool catalog (`tools/default_catalog.json`).

Config files are run by path (`get_config()`), never imported as modules; this file only lets the wheel carry
the folder as `orchestra_jax.resources.configs`, so the names work from any directory once installed.
"""
