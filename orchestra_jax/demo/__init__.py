"""A miniature of ToolOrchestra for a CPU demo: synthetic tasks, three priced tools served for real.

`orchestra_jax.demo.world` holds the task family (arithmetic / capital / element questions), the priced
`answer(model)` tool with the aliases `calc`, `small` and `expert` (served by a local `ScriptedServer` and the
real sandbox), the preference presets and the warm-up (SFT) data. Nothing is imported here so that
`import orchestra_jax.demo` stays cheap; import `orchestra_jax.demo.world` for the API.
"""
