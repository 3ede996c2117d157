"""Discovery of class-per-folder datasets, the read order and DALI's shard formula."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from pipelines import InputError, discover, read_order, shard, shard_bounds


def touch(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")


def test_labels_come_from_sorted_class_folders(tmp_path: Path) -> None:
    for name in ("zebra/b.jpg", "zebra/a.JPEG", "ant/x.png", "ant/deep/y.jpg", "mole/m.webp"):
        touch(tmp_path / name)
    touch(tmp_path / "ant" / "notes.txt")
    touch(tmp_path / "ant" / ".hidden.jpg")
    touch(tmp_path / ".cache" / "thumb.jpg")
    touch(tmp_path / "loose.jpg")

    dataset = discover(tmp_path)

    assert dataset.classes == ("ant", "mole", "zebra")
    relative = [str(Path(f).relative_to(tmp_path)) for f in dataset.files]
    assert relative == ["ant/x.png", "ant/deep/y.jpg", "mole/m.webp", "zebra/a.JPEG", "zebra/b.jpg"]
    assert dataset.labels == (0, 0, 1, 2, 2)
    assert all(Path(f).is_absolute() for f in dataset.files)


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        (None, "dataset folder not found"),
        ([], "dataset folder is empty"),
        (["a/readme.txt"], "no images found in the class folders"),
        (["one.jpg", "two.jpg"], "no class folders in"),
    ],
)
def test_unusable_folders_are_named(tmp_path: Path, layout: list[str] | None, message: str) -> None:
    root = tmp_path / "data"
    if layout is not None:
        root.mkdir()
        for name in layout:
            touch(root / name)
    with pytest.raises(InputError, match=message) as caught:
        discover(root)
    assert str(root) in str(caught.value)


def test_a_file_is_not_a_dataset_folder(tmp_path: Path) -> None:
    touch(tmp_path / "file.jpg")
    with pytest.raises(InputError, match="not a folder"):
        discover(tmp_path / "file.jpg")


@pytest.mark.parametrize("num_files", [1, 2, 3, 7, 10, 37, 1000])
@pytest.mark.parametrize("num_shards", [1, 2, 3, 4])
def test_shards_are_disjoint_contiguous_and_cover_everything(
    num_files: int, num_shards: int
) -> None:
    bounds = [shard_bounds(num_files, i, num_shards) for i in range(num_shards)]
    assert bounds[0][0] == 0
    assert bounds[-1][1] == num_files
    for (_, end), (start, _) in itertools.pairwise(bounds):
        assert end == start
    sizes = [end - start for start, end in bounds]
    assert max(sizes) - min(sizes) <= 1


def test_shard_bounds_follow_dalis_formula() -> None:
    # size * shard_id / num_shards, in integers: 18 files in 4 shards -> 4, 5, 4, 5
    assert [shard_bounds(18, i, 4) for i in range(4)] == [(0, 4), (4, 9), (9, 13), (13, 18)]


def test_read_order_is_one_seeded_permutation(coded_dataset: Path) -> None:
    dataset = discover(coded_dataset)
    first = read_order(dataset, shuffle=True, seed=7)
    again = read_order(discover(coded_dataset), shuffle=True, seed=7)
    other = read_order(dataset, shuffle=True, seed=8)
    assert first.files == again.files
    assert first.files != other.files
    assert sorted(first.files) == sorted(dataset.files)
    pairs = dict(zip(dataset.files, dataset.labels, strict=True))
    assert all(pairs[f] == label for f, label in zip(first.files, first.labels, strict=True))
    assert read_order(dataset, shuffle=False, seed=7) == dataset


def test_more_shards_than_files_is_an_error(tmp_path: Path) -> None:
    touch(tmp_path / "a" / "1.jpg")
    touch(tmp_path / "a" / "2.jpg")
    dataset = discover(tmp_path)
    assert len(shard(dataset, 1, 2)) == 1
    with pytest.raises(InputError, match="shard 0 of 3 would be empty: the dataset has only 2"):
        shard(dataset, 0, 3)
