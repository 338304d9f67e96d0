#include "bindings.h"
#include "cuda_arguments.h"
#include "dlpack_view.h"
#include "handle_stream.h"
#include "typed_arguments.h"

#include <kvcache/core/errors.h>
#include <kvcache/paging/page_table.h>

#include <fmt/format.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <vector>

namespace kvcache::python
{
namespace
{

//! PageTableBuffers with its stream (created here unless given) and the event that orders consumers of its device
//! tables after the last upload.
class PageTableHandle
{
public:
    PageTableHandle(int32_t maxBatchSize, int32_t maxPagesPerSequence, int32_t tokensPerPage, nb::handle stream)
        : mStream(stream)
        , mTables(std::make_unique<rt::PageTableBuffers>(
              maxBatchSize, maxPagesPerSequence, tokensPerPage, mStream.stream()))
    {
        int32_t device = 0;
        KVCACHE_CUDA_TRY(cudaGetDevice(&device));
        mStream.createEvent(device);
    }
    PageTableHandle(PageTableHandle const&) = delete;
    PageTableHandle& operator=(PageTableHandle const&) = delete;

    rt::PageTableBuffers& tables() noexcept
    {
        return *mTables;
    }
    StreamOrder const& order() const noexcept
    {
        return mStream.order();
    }

    void build(TableSequencesArgument const& sequences, StreamArgument const& stream)
    {
        cudaStream_t const buildStream = streamArgument(stream, mStream.stream());
        size_t count = 0;
        for (nb::handle sequence : sequences)
        {
            if (!nb::isinstance<nb::sequence>(sequence) || nb::len(sequence) != 2)
            {
                throw rt::InvalidArgumentError(fmt::format("sequences[{}] must be a (pages, num_tokens) pair", count));
            }
            if (count == mPages.size())
            {
                mPages.emplace_back();
            }
            nb::sequence const entry = nb::borrow<nb::sequence>(sequence);
            hostPageIds(entry[0], mPages[count]);
            int64_t const numTokens = intArgument(entry[1], fmt::format("sequences[{}][1]", count).c_str());
            if (count == mSequences.size())
            {
                mSequences.emplace_back();
            }
            mSequences[count].pages = mPages[count].data();
            mSequences[count].numPages = toInt32(
                static_cast<int64_t>(mPages[count].size()), fmt::format("len(sequences[{}][0])", count).c_str());
            mSequences[count].numTokens = toInt32(numTokens, fmt::format("sequences[{}][1]", count).c_str());
            ++count;
        }
        mTables->build(mSequences.data(), toInt32(static_cast<int64_t>(count), "len(sequences)"), buildStream);
        mStream.order().producer = buildStream;
    }

private:
    HandleStream mStream;
    std::unique_ptr<rt::PageTableBuffers> mTables;
    // Reused between builds, so that a steady batch allocates nothing.
    std::vector<std::vector<int32_t>> mPages;
    std::vector<rt::SequencePages> mSequences;
};

using Self = nb::pointer_and_handle<PageTableHandle>;

DLPackView tableView(Self self, int32_t const* data, rt::Coords const& shape)
{
    rt::Tensor const tensor(const_cast<int32_t*>(data), shape, rt::DataType::kINT32, rt::DeviceType::kGPU);
    return DLPackView(tensor, kDLCUDA, self.p->order().device, &self.p->order(), nb::borrow(self.h));
}

std::vector<int32_t> hostCopy(int32_t const* data, int64_t count)
{
    return data == nullptr ? std::vector<int32_t>{} : std::vector<int32_t>(data, data + count);
}

} // namespace

void bindPageTable(nb::module_& m)
{
    nb::class_<PageTableHandle>(m, "PageTableBuffers",
        "Device page tables of one page group (CSR: indptr, indices, last_page_len; dense block table) at device "
        "addresses that never change, so a captured CUDA graph keeps reading them. Views of them keep this object "
        "alive.")
        .def(
            "__init__",
            [](PageTableHandle* self, int64_t maxBatchSize, int64_t maxPagesPerSequence, int64_t tokensPerPage,
                StreamArgument const& stream)
            {
                new (self) PageTableHandle(toInt32(maxBatchSize, "max_batch_size"),
                    toInt32(maxPagesPerSequence, "max_pages_per_sequence"), toInt32(tokensPerPage, "tokens_per_page"),
                    stream);
            },
            nb::arg("max_batch_size"), nb::arg("max_pages_per_sequence"), nb::arg("tokens_per_page"),
            nb::arg("stream") = nb::none(), "Allocates the tables on the current device and uploads those of count 0.")
        .def("build", &PageTableHandle::build, nb::arg("sequences"), nb::arg("stream") = nb::none(),
            "Builds the tables of `sequences`, each a (pages, num_tokens) pair (pages: ints or an int array), and "
            "enqueues one upload on `stream` (default: the constructor's). All or nothing (InvalidArgumentError).")
        .def(
            "indptr",
            [](Self self) {
                return tableView(
                    self, self.p->tables().deviceIndptr(), rt::Coords{self.p->tables().maxBatchSize() + 1});
            },
            "Device view of the CSR row pointers [max_batch_size + 1] (int32).")
        .def(
            "indices",
            [](Self self)
            {
                rt::PageTableBuffers const& t = self.p->tables();
                return tableView(
                    self, t.deviceIndices(), rt::Coords{int64_t{t.maxBatchSize()} * t.maxPagesPerSequence()});
            },
            "Device view of the CSR page ids [max_batch_size * max_pages_per_sequence] (int32; indptr[count] in use).")
        .def(
            "last_page_len",
            [](Self self) {
                return tableView(
                    self, self.p->tables().deviceLastPageLen(), rt::Coords{self.p->tables().maxBatchSize()});
            },
            "Device view of the tokens in each sequence's last page [max_batch_size] (int32).")
        .def(
            "block_table",
            [](Self self)
            {
                rt::PageTableBuffers const& t = self.p->tables();
                return tableView(self, t.deviceBlockTable(), rt::Coords{t.maxBatchSize(), t.maxPagesPerSequence()});
            },
            "Device view of the dense block table [max_batch_size, max_pages_per_sequence] (int32, UNUSED_PAGE_ENTRY "
            "padding).")
        .def(
            "host_indptr",
            [](PageTableHandle& h)
            { return hostCopy(h.tables().hostIndptr(), int64_t{h.tables().maxBatchSize()} + 1); },
            "A copy of the staged indptr of the last build.")
        .def(
            "host_indices",
            [](PageTableHandle& h)
            {
                int32_t const* indptr = h.tables().hostIndptr();
                return hostCopy(h.tables().hostIndices(), indptr == nullptr ? 0 : indptr[h.tables().count()]);
            },
            "A copy of the staged page ids in use of the last build.")
        .def(
            "host_last_page_len",
            [](PageTableHandle& h) { return hostCopy(h.tables().hostLastPageLen(), h.tables().maxBatchSize()); },
            "A copy of the staged last-page lengths of the last build.")
        .def(
            "host_block_table",
            [](PageTableHandle& h)
            {
                return hostCopy(
                    h.tables().hostBlockTable(), int64_t{h.tables().maxBatchSize()} * h.tables().maxPagesPerSequence());
            },
            "A copy of the staged block table of the last build, flattened row-major.")
        .def("count", [](PageTableHandle& h) { return h.tables().count(); })
        .def("max_batch_size", [](PageTableHandle& h) { return h.tables().maxBatchSize(); })
        .def("max_pages_per_sequence", [](PageTableHandle& h) { return h.tables().maxPagesPerSequence(); })
        .def("tokens_per_page", [](PageTableHandle& h) { return h.tables().tokensPerPage(); })
        .def("upload_bytes", [](PageTableHandle& h) { return h.tables().uploadBytes(); });
}

} // namespace kvcache::python

// The per-sequence arrays of windowed tables, added to the class defined above.
#include "write_binding.h" // NOLINT: kept beside the appended definitions

namespace kvcache::python
{

void bindPageTableTokenArrays(nb::module_& m)
{
    nb::object const cls = m.attr("PageTableBuffers");
    auto const method = [&](char const* name, auto&& function, char const* doc)
    { nb::setattr(cls, name, nb::cpp_function(function, nb::is_method(), nb::scope(cls), nb::name(name), doc)); };
    method(
        "first_token",
        [](Self self)
        { return tableView(self, self.p->tables().deviceFirstToken(), rt::Coords{self.p->tables().maxBatchSize()}); },
        "Device view of each row's first token position [max_batch_size] (int32): the pages a window released times "
        "tokens_per_page, 0 for full attention.");
    method(
        "resident_tokens",
        [](Self self) {
            return tableView(
                self, self.p->tables().deviceResidentTokens(), rt::Coords{self.p->tables().maxBatchSize()});
        },
        "Device view of the tokens each row holds from its first token on [max_batch_size] (int32): kernels' "
        "seq_lens / kv_len.");
    method(
        "host_first_token",
        [](PageTableHandle& h) { return hostCopy(h.tables().hostFirstToken(), h.tables().maxBatchSize()); },
        "A copy of the staged first tokens of the last build.");
    method(
        "host_resident_tokens",
        [](PageTableHandle& h) { return hostCopy(h.tables().hostResidentTokens(), h.tables().maxBatchSize()); },
        "A copy of the staged resident token counts of the last build.");
}

} // namespace kvcache::python
