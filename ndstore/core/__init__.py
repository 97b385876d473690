"""Pure, numpy-only building blocks: Morton codes, geometry, codecs, key schema, errors."""
