"""The ground every other part stands on: errors, the registry, the SoC table, the cache, atomic writes,
file hashes and numeric comparisons. Imports nothing else of modelexport."""
