"""The tile geometry of an ingest and the tile decoder (pure functions)."""

from __future__ import annotations

import numpy as np
import pytest

from ndstore.core.errors import InvalidBody, InvalidRequest
from ndstore.core.geometry import Box, grid_for_level
from ndstore.core.tiles import TileLayout, TileRef, decode_tile, encode_tile, parse_tile_key, tile_key

GRID = grid_for_level("anisotropic", 0, 1)  # supercuboid 512 x 512 x 64


def layout(box: Box, tile: int = 256, times: range = range(1)) -> TileLayout:
    return TileLayout(box, tile, tile, times, GRID)


def test_every_tile_belongs_to_one_supercuboid_and_ordinals_number_them() -> None:
    lay = layout(Box((0, 0, 0), (1100, 600, 70)), times=range(2))
    lay.validate()
    seen: set[TileRef] = set()
    for sc in lay.supercuboids():
        tiles = lay.tiles_of(sc)
        assert [lay.ordinal(t) for t in tiles] == list(range(len(tiles)))
        assert lay.tile_count_of(sc) == len(tiles)
        assert all(lay.supercuboid_of(t) == sc for t in tiles)
        region = lay.region_of(sc)
        assert all(region.contains(lay.tile_box(t)) for t in tiles)
        seen.update(tiles)
    assert len(seen) == lay.tile_count() == 5 * 3 * 70 * 2  # x tiles 0..4 (the last clipped), y 0..2
    assert list(lay.manifest()) == [t for sc in lay.supercuboids() for t in lay.tiles_of(sc)]
    assert lay.supercuboid_count() == 3 * 2 * 2 * 2
    edge = lay.tile_box(TileRef(0, 0, 2, 4))
    assert edge == Box((1024, 512, 0), (1100, 600, 1))


@pytest.mark.parametrize(("box", "tile", "message"), [
    (Box((0, 0, 0), (512, 512, 4)), 384, "tile_x 384 must divide the supercuboid extent 512"),
    (Box((100, 0, 0), (512, 512, 4)), 256, "must start on the tile grid"),
    (Box((0, 0, 0), (512, 512, 4)), 32, r"16384 tiles per supercuboid \(512x512x64\); at most 4096"),
])
def test_a_layout_that_cannot_work_is_refused_with_the_reason(box: Box, tile: int, message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        layout(box, tile).validate()


@pytest.mark.parametrize("box", [Box((0, 0, 0), (1100, 600, 70)), Box((512, 256, 60), (1536, 1000, 200)),
                                 Box((256, 0, 3), (300, 256, 4))])
def test_a_manifest_position_is_found_by_arithmetic(box: Box) -> None:
    """locate, offset_of, supercuboid_at and manifest(start) agree with walking the manifest
    (they cost O(1): a lease deep into a large job's manifest no longer walks to its position)."""
    lay = layout(box, tile=128, times=range(1, 3))
    walked = [(number, within, tile) for number, sc in enumerate(lay.supercuboids())
              for within, tile in enumerate(lay.tiles_of(sc))]
    assert len(walked) == lay.tile_count()
    for offset, (number, within, _) in enumerate(walked):
        assert lay.locate(offset) == (number, within)
        if within == 0:
            assert lay.offset_of(lay.supercuboid_at(number)) == offset
    assert [lay.supercuboid_at(n) for n in range(lay.supercuboid_count())] == list(lay.supercuboids())
    for start in (0, 1, 17, len(walked) // 2, len(walked) - 1, len(walked)):
        assert list(lay.manifest(start)) == [t for _, _, t in walked[start:]]


def test_tile_keys_round_trip() -> None:
    tile = TileRef(3, 17, 2, 5)
    assert tile_key(42, tile, "tif") == "42/3/17/2/5.tif"
    assert parse_tile_key(tile_key(42, tile, "png")) == (42, tile)
    with pytest.raises(ValueError, match="not a tile key"):
        parse_tile_key("42/../etc/passwd")


def test_decode_tile_accepts_full_or_clipped_tiles_and_names_what_is_wrong() -> None:
    rng = np.random.default_rng(0)
    full = rng.integers(0, 255, (256, 256), dtype=np.uint8)
    got = decode_tile(encode_tile(full, "png"), "t", (256, 256), (100, 76), np.dtype(np.uint8))
    assert np.array_equal(got, full[:100, :76])
    assert np.array_equal(decode_tile(encode_tile(full[:100, :76], "png"), "t", (256, 256), (100, 76),
                                      np.dtype(np.uint8)), full[:100, :76])
    wide = rng.integers(0, 60000, (64, 64), dtype=np.uint16)
    assert np.array_equal(decode_tile(encode_tile(wide, "tif"), "t", (64, 64), (64, 64), np.dtype(np.uint16)), wide)
    with pytest.raises(InvalidBody, match=r"holds values \d+\.\.\d+ that a uint8 channel cannot store"):
        decode_tile(encode_tile(wide, "png"), "t", (64, 64), (64, 64), np.dtype(np.uint8))
    with pytest.raises(InvalidBody, match="tile 7 is 64x64 pixels; expected 256x256"):
        decode_tile(encode_tile(full[:64, :64], "png"), "tile 7", (256, 256), (256, 256), np.dtype(np.uint8))
    with pytest.raises(InvalidBody, match="not a readable PNG/TIFF"):
        decode_tile(b"not an image", "t", (64, 64), (64, 64), np.dtype(np.uint8))
    rgb = np.zeros((8, 8, 3), np.uint8)
    with pytest.raises(InvalidBody, match="single-channel"):
        decode_tile(encode_tile(rgb, "png"), "t", (8, 8), (8, 8), np.dtype(np.uint8))
