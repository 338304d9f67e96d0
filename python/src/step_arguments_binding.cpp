#include "bindings.h"
#include "cuda_arguments.h"
#include "dlpack_view.h"
#include "handle_stream.h"
#include "page_manager_handle.h"
#include "typed_arguments.h"

#include <kvcache/core/errors.h>
#include <kvcache/paging/step_arguments.h>

#include <fmt/format.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <vector>

namespace kvcache::python
{
namespace
{

//! StepArgumentBuffers with the PageManager object it is built from (kept alive), its stream (created here unless
//! given) and the event that orders consumers of its views after the last upload.
class StepArgumentsHandle
{
public:
    StepArgumentsHandle(nb::handle manager, int32_t maxBatchSize, int32_t maxTokensPerStep, nb::handle stream)
        : mManager(nb::borrow(manager))
        , mStream(stream)
        , mArguments(std::make_unique<rt::StepArgumentBuffers>(
              pageManagerArgument(manager, "manager").manager, maxBatchSize, maxTokensPerStep, mStream.stream()))
    {
        int32_t device = 0;
        KVCACHE_CUDA_TRY(cudaGetDevice(&device));
        mStream.createEvent(device);
    }
    StepArgumentsHandle(StepArgumentsHandle const&) = delete;
    StepArgumentsHandle& operator=(StepArgumentsHandle const&) = delete;

    rt::StepArgumentBuffers& arguments() noexcept
    {
        return *mArguments;
    }
    StreamOrder const& order() const noexcept
    {
        return mStream.order();
    }

    void build(StepEntriesArgument const& entries, StreamArgument const& stream)
    {
        cudaStream_t const buildStream = streamArgument(stream, mStream.stream());
        mEntries.clear();
        for (nb::handle entry : entries)
        {
            size_t const index = mEntries.size();
            if (!nb::isinstance<nb::sequence>(entry) || nb::len(entry) < 2)
            {
                throw rt::InvalidArgumentError(fmt::format(
                    "entries[{}] must be a (sequence, tokens) pair, tokens a list of token ids or their count", index));
            }
            nb::sequence const pair = nb::borrow<nb::sequence>(entry);
            rt::SequenceAppend append;
            append.sequence = intArgument(pair[0], fmt::format("entries[{}][0]", index).c_str());
            nb::handle const tokens = pair[1];
            int64_t const count = nb::isinstance<nb::int_>(tokens)
                ? intArgument(tokens, fmt::format("entries[{}][1]", index).c_str())
                : static_cast<int64_t>(nb::len(tokens));
            append.count = toInt32(count, fmt::format("entries[{}][1]", index).c_str());
            mEntries.push_back(append);
        }
        rt::PageManager const& manager = pageManagerArgument(mManager, "manager").manager;
        mArguments->build(
            manager, mEntries.data(), toInt32(static_cast<int64_t>(mEntries.size()), "len(entries)"), buildStream);
        mStream.order().producer = buildStream;
    }

private:
    nb::object mManager;
    HandleStream mStream;
    std::unique_ptr<rt::StepArgumentBuffers> mArguments;
    // Reused between builds, so that a steady batch allocates nothing.
    std::vector<rt::SequenceAppend> mEntries;
};

using Self = nb::pointer_and_handle<StepArgumentsHandle>;

DLPackView argumentView(Self self, int32_t const* data, rt::Coords const& shape)
{
    rt::Tensor const tensor(const_cast<int32_t*>(data), shape, rt::DataType::kINT32, rt::DeviceType::kGPU);
    return DLPackView(tensor, kDLCUDA, self.p->order().device, &self.p->order(), nb::borrow(self.h));
}

std::vector<int32_t> hostCopy(int32_t const* data, int64_t count)
{
    return data == nullptr ? std::vector<int32_t>{} : std::vector<int32_t>(data, data + count);
}

//! Rows in view: the last build's entries, or every row with `full`.
int64_t rows(rt::StepArgumentBuffers const& a, bool full)
{
    return full ? a.maxBatchSize() : a.count();
}

int32_t groupArgument(rt::StepArgumentBuffers const& a, int64_t group)
{
    if (group < 0 || group >= a.numGroups())
    {
        throw rt::OutOfRangeError(fmt::format("group is {}; it must be in [0, {})", group, a.numGroups()));
    }
    return static_cast<int32_t>(group);
}

} // namespace

void bindStepArguments(nb::module_& m)
{
    auto cls = nb::class_<StepArgumentsHandle>(m, "StepArguments",
        "A step's kernel arguments for every page group (token positions, qo_indptr, the token count, each entry's "
        "state slot, and per group "
        "CSR indptr / indices / last_page_len / first_token / resident_tokens and the block table, windowed groups at "
        "their own width), built from the step's entries in one call and one upload, at device addresses that never "
        "change. Views of them keep this object alive; views are sized to the last build unless full=True.");
    cls.def(
        "__init__",
        [](StepArgumentsHandle* self, nb::handle manager, int64_t maxBatchSize, int64_t maxTokensPerStep,
            StreamArgument const& stream)
        {
            new (self) StepArgumentsHandle(manager, toInt32(maxBatchSize, "max_batch_size"),
                toInt32(maxTokensPerStep, "max_tokens_per_step"), stream);
        },
        nb::arg("manager"), nb::arg("max_batch_size"), nb::arg("max_tokens_per_step"), nb::arg("stream") = nb::none(),
        nb::sig("def __init__(self, manager: PageManager, max_batch_size: int, max_tokens_per_step: int, stream: "
                "StreamLike | None = None) -> None"),
        "Sizes the arguments for the manager's page groups and uploads those of an empty step.");
    cls.def("build", &StepArgumentsHandle::build, nb::arg("entries"), nb::arg("stream") = nb::none(),
        "Builds the arguments of the step `entries` (what PageManager.step took: (sequence, tokens[, extra_keys]), or "
        "(sequence, token count)), called after that step, and enqueues one upload on `stream` (default: the "
        "constructor's). Row b is entry b; an entry of 0 tokens has table rows and no query tokens. All or nothing "
        "(InvalidArgumentError).");
    cls.def(
        "positions",
        [](Self self, bool full)
        {
            rt::StepArgumentBuffers const& a = self.p->arguments();
            int64_t const n = full ? a.maxTokensPerStep() : a.tokenCount();
            return argumentView(self, reinterpret_cast<int32_t const*>(a.devicePositions()), rt::Coords{n, 2});
        },
        nb::kw_only(), nb::arg("full") = false,
        "Device view of the (row, position) pairs [token_count, 2] (int32) write_tokens_paged takes; full: "
        "[max_tokens_per_step, 2], rows past token_count (-1, 0), which the write skips.");
    cls.def(
        "qo_indptr",
        [](Self self, bool full)
        {
            rt::StepArgumentBuffers const& a = self.p->arguments();
            return argumentView(self, a.deviceQoIndptr(), rt::Coords{rows(a, full) + 1});
        },
        nb::kw_only(), nb::arg("full") = false,
        "Device view of qo_indptr [count + 1] (int32; full: max_batch_size + 1).");
    cls.def(
        "token_count",
        [](Self self) { return argumentView(self, self.p->arguments().deviceTokenCount(), rt::Coords{1}); },
        "Device view of the step's token count [1] (int32), for write_tokens_paged's count.");
    cls.def(
        "state_slots",
        [](Self self, bool full)
        {
            rt::StepArgumentBuffers const& a = self.p->arguments();
            return argumentView(self, a.deviceStateSlots(), rt::Coords{rows(a, full)});
        },
        nb::kw_only(), nb::arg("full") = false,
        "Device view of each entry's state slot [count] (int32; full: max_batch_size, rows past count -1): "
        "PageManager.state_slot of the entry's sequence, the state_indices of batched recurrent kernels. -1 in every "
        "row for a layout without state layers.");
    cls.def(
        "indptr",
        [](Self self, int64_t group, bool full)
        {
            rt::StepArgumentBuffers const& a = self.p->arguments();
            return argumentView(self, a.deviceIndptr(groupArgument(a, group)), rt::Coords{rows(a, full) + 1});
        },
        nb::arg("group"), nb::kw_only(), nb::arg("full") = false,
        "Device view of group `group`'s CSR row pointers [count + 1] (int32; full: max_batch_size + 1).");
    cls.def(
        "indices",
        [](Self self, int64_t group, bool full)
        {
            rt::StepArgumentBuffers const& a = self.p->arguments();
            int32_t const g = groupArgument(a, group);
            int64_t const n = full ? int64_t{a.maxBatchSize()} * a.maxPagesPerSequence(g) : a.usedIndices(g);
            return argumentView(self, a.deviceIndices(g), rt::Coords{n});
        },
        nb::arg("group"), nb::kw_only(), nb::arg("full") = false,
        "Device view of group `group`'s CSR page ids in use [indptr[count]] (int32; full: the whole room).");
    auto const perRow =
        [&](char const* name, int32_t const* (rt::StepArgumentBuffers::*array)(int32_t) const, char const* doc)
    {
        cls.def(
            name,
            [array](Self self, int64_t group, bool full)
            {
                rt::StepArgumentBuffers const& a = self.p->arguments();
                return argumentView(self, (a.*array)(groupArgument(a, group)), rt::Coords{rows(a, full)});
            },
            nb::arg("group"), nb::kw_only(), nb::arg("full") = false, doc);
    };
    perRow("last_page_len", &rt::StepArgumentBuffers::deviceLastPageLen,
        "Device view of group `group`'s tokens in each row's last page [count] (int32; full: max_batch_size).");
    perRow("first_token", &rt::StepArgumentBuffers::deviceFirstToken,
        "Device view of group `group`'s first token of each row [count] (int32; full: max_batch_size): the pages a "
        "window released times tokens_per_page.");
    perRow("resident_tokens", &rt::StepArgumentBuffers::deviceResidentTokens,
        "Device view of group `group`'s tokens each row holds [count] (int32; full: max_batch_size): kernels' "
        "seq_lens / kv_len.");
    cls.def(
        "block_table",
        [](Self self, int64_t group, bool full)
        {
            rt::StepArgumentBuffers const& a = self.p->arguments();
            int32_t const g = groupArgument(a, group);
            return argumentView(self, a.deviceBlockTable(g), rt::Coords{rows(a, full), a.maxPagesPerSequence(g)});
        },
        nb::arg("group"), nb::kw_only(), nb::arg("full") = false,
        "Device view of group `group`'s dense block table [count, max_pages_per_sequence(group)] (int32, "
        "UNUSED_PAGE_ENTRY padding; full: max_batch_size rows).");
    cls.def(
        "host_positions",
        [](StepArgumentsHandle& h)
        {
            rt::StepArgumentBuffers const& a = h.arguments();
            return hostCopy(reinterpret_cast<int32_t const*>(a.hostPositions()), 2 * int64_t{a.maxTokensPerStep()});
        },
        "A copy of the staged positions of the last build, flattened: 2 * max_tokens_per_step values.");
    cls.def(
        "host_qo_indptr",
        [](StepArgumentsHandle& h)
        { return hostCopy(h.arguments().hostQoIndptr(), int64_t{h.arguments().maxBatchSize()} + 1); },
        "A copy of the staged qo_indptr of the last build [max_batch_size + 1].");
    cls.def(
        "host_state_slots",
        [](StepArgumentsHandle& h)
        { return hostCopy(h.arguments().hostStateSlots(), int64_t{h.arguments().maxBatchSize()}); },
        "A copy of the staged state slots of the last build [max_batch_size], -1 past count.");
    auto const hostPerGroup = [&](char const* name, int32_t const* (rt::StepArgumentBuffers::*array)(int32_t) const,
                                  int32_t extra, char const* doc)
    {
        cls.def(
            name,
            [array, extra](StepArgumentsHandle& h, int64_t group)
            {
                rt::StepArgumentBuffers const& a = h.arguments();
                return hostCopy((a.*array)(groupArgument(a, group)), int64_t{a.maxBatchSize()} + extra);
            },
            nb::arg("group"), doc);
    };
    hostPerGroup("host_indptr", &rt::StepArgumentBuffers::hostIndptr, 1,
        "A copy of group `group`'s staged indptr [max_batch_size + 1].");
    hostPerGroup("host_last_page_len", &rt::StepArgumentBuffers::hostLastPageLen, 0,
        "A copy of group `group`'s staged last-page lengths [max_batch_size].");
    hostPerGroup("host_first_token", &rt::StepArgumentBuffers::hostFirstToken, 0,
        "A copy of group `group`'s staged first tokens [max_batch_size].");
    hostPerGroup("host_resident_tokens", &rt::StepArgumentBuffers::hostResidentTokens, 0,
        "A copy of group `group`'s staged resident token counts [max_batch_size].");
    cls.def(
        "host_indices",
        [](StepArgumentsHandle& h, int64_t group)
        {
            rt::StepArgumentBuffers const& a = h.arguments();
            int32_t const g = groupArgument(a, group);
            return hostCopy(a.hostIndices(g), a.usedIndices(g));
        },
        nb::arg("group"), "A copy of group `group`'s staged page ids in use.");
    cls.def(
        "host_block_table",
        [](StepArgumentsHandle& h, int64_t group)
        {
            rt::StepArgumentBuffers const& a = h.arguments();
            int32_t const g = groupArgument(a, group);
            return hostCopy(a.hostBlockTable(g), int64_t{a.maxBatchSize()} * a.maxPagesPerSequence(g));
        },
        nb::arg("group"), "A copy of group `group`'s staged block table, flattened row-major.");
    cls.def("count", [](StepArgumentsHandle& h) { return h.arguments().count(); });
    cls.def("host_token_count", [](StepArgumentsHandle& h) { return h.arguments().tokenCount(); });
    cls.def("num_groups", [](StepArgumentsHandle& h) { return h.arguments().numGroups(); });
    cls.def("max_batch_size", [](StepArgumentsHandle& h) { return h.arguments().maxBatchSize(); });
    cls.def("max_tokens_per_step", [](StepArgumentsHandle& h) { return h.arguments().maxTokensPerStep(); });
    cls.def("tokens_per_page", [](StepArgumentsHandle& h) { return h.arguments().tokensPerPage(); });
    cls.def(
        "max_pages_per_sequence",
        [](StepArgumentsHandle& h, int64_t group)
        { return h.arguments().maxPagesPerSequence(groupArgument(h.arguments(), group)); },
        nb::arg("group"));
    cls.def("upload_bytes", [](StepArgumentsHandle& h) { return h.arguments().uploadBytes(); });
}

} // namespace kvcache::python
