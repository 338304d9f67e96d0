"""PageAllocator through Python against a model of its documented rules (LIFO free list, reference counts, all or
nothing). No GPU."""

import random

import pytest

import kvcache


class AllocatorModel:
    """Free list as a stack (most recently freed on top; a new allocator hands out 0, 1, 2, ...) and counts."""

    def __init__(self, num_pages):
        self.free = list(range(num_pages - 1, -1, -1))
        self.counts = [0] * num_pages

    def allocate(self):
        page = self.free.pop()
        self.counts[page] = 1
        return page

    def retain(self, page):
        self.counts[page] += 1

    def release(self, page):
        self.counts[page] -= 1
        if self.counts[page] == 0:
            self.free.append(page)


def assert_same(allocator, model):
    assert allocator.num_free() == len(model.free)
    assert allocator.num_used() == len(model.counts) - len(model.free)
    assert [allocator.ref_count(p) for p in range(len(model.counts))] == model.counts
    allocator.check_invariants()


def test_random_operations_follow_the_model():
    rng = random.Random(12)
    allocator, model = kvcache.PageAllocator(64), AllocatorModel(64)
    for _ in range(3000):
        used = [p for p, c in enumerate(model.counts) if c > 0]
        action = rng.choice(["one", "many", "retain", "release", "release_list"])
        if action == "one" and model.free:
            assert allocator.allocate() == model.allocate()
        elif action == "many":
            count = rng.randint(0, 5)
            if count <= len(model.free):
                assert allocator.allocate(count) == [model.allocate() for _ in range(count)]
            else:
                with pytest.raises(MemoryError):
                    allocator.allocate(count)
        elif action == "retain" and used:
            page = rng.choice(used)
            allocator.retain(page)
            model.retain(page)
        elif action == "release" and used:
            page = rng.choice(used)
            allocator.release(page)
            model.release(page)
        elif action == "release_list" and used:
            pages = rng.sample(used, min(len(used), 3))
            allocator.release(pages)
            for page in pages:
                model.release(page)
    assert_same(allocator, model)


def test_allocate_many_is_all_or_nothing():
    allocator = kvcache.PageAllocator(4)
    assert allocator.allocate(3) == [0, 1, 2]
    with pytest.raises(kvcache.OutOfMemoryError) as error:
        allocator.allocate(2)
    assert "2 needed" in str(error.value) and "1 free" in str(error.value)
    assert allocator.num_free() == 1
    assert allocator.allocate() == 3
    with pytest.raises(MemoryError):
        allocator.allocate()


def test_release_list_is_all_or_nothing():
    allocator = kvcache.PageAllocator(8)
    pages = allocator.allocate(4)
    with pytest.raises(kvcache.InvalidArgumentError):
        allocator.release([pages[0], pages[1], 6])  # 6 is free
    assert [allocator.ref_count(p) for p in pages] == [1, 1, 1, 1]
    with pytest.raises(ValueError):
        allocator.release([pages[0], pages[0]])  # listed more times than its count
    assert allocator.ref_count(pages[0]) == 1
    with pytest.raises(IndexError):
        allocator.release([pages[0], 8])
    assert allocator.num_free() == 4


def test_out_of_range_ids_raise_index_error_naming_the_range():
    allocator = kvcache.PageAllocator(8)
    with pytest.raises(kvcache.OutOfRangeError) as error:
        allocator.ref_count(8)
    assert "8" in str(error.value)
    with pytest.raises(IndexError):
        allocator.retain(-1)
    with pytest.raises(ValueError, match="num_pages is -1"):
        kvcache.PageAllocator(-1)


def test_allocate_into_fills_a_numpy_array_in_lifo_order(np):
    allocator = kvcache.PageAllocator(16)
    first = allocator.allocate(6)
    allocator.release(np.array([first[1], first[4]], dtype=np.int64))
    out = np.full(3, -7, dtype=np.int32)
    allocator.allocate_into(out)
    # first[4] was freed last: it comes back first, then first[1], then the next never-used page.
    assert out.tolist() == [first[4], first[1], 6]
    with pytest.raises(MemoryError):
        allocator.allocate_into(np.zeros(100, dtype=np.int32))
    assert allocator.num_free() == 16 - 7


@pytest.mark.parametrize("make_out, described", [
    (lambda np: np.full(3, -7, dtype=np.int64), r"dtype int64, shape \(3\), strides \(1\)"),
    (lambda np: np.full(6, -7, dtype=np.int32)[::2], r"dtype int32, shape \(3\), strides \(2\)"),
    (lambda np: np.full((3, 1), -7, dtype=np.int32), r"dtype int32, shape \(3, 1\), strides \(1, 1\)"),
])
def test_allocate_into_refuses_an_array_it_cannot_fill_in_place(np, make_out, described):
    allocator = kvcache.PageAllocator(8)
    taken = allocator.allocate(2)
    out = make_out(np)
    before = out.copy()
    with pytest.raises(kvcache.InvalidArgumentError, match=f"^out has {described}.*; it must be a writable "
                       "one-dimensional C-contiguous int32 host array$"):
        allocator.allocate_into(out)
    assert np.array_equal(out, before)
    assert allocator.num_free() == 6 and allocator.num_used() == 2  # no page taken
    assert allocator.allocate() == 2  # the free list is as it was
    assert [allocator.ref_count(p) for p in taken] == [1, 1]
    allocator.check_invariants()


def test_allocate_into_refuses_read_only_arrays_and_non_arrays(np):
    allocator = kvcache.PageAllocator(8)
    read_only = np.full(2, -7, dtype=np.int32)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="out is a read-only array"):
        allocator.allocate_into(read_only)
    with pytest.raises(TypeError, match="out is a list; expected a writable"):
        allocator.allocate_into([0, 0])
    with pytest.raises(ValueError, match="page is 18446744073709551616; it must fit in int64"):
        allocator.release(2**64)
    assert allocator.num_free() == 8
    allocator.check_invariants()
