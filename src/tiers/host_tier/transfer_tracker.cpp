#include "tiers/host_tier/transfer_tracker.h"

#include "kvcache/core/errors.h"

#include <algorithm>

namespace kvcache::rt::detail
{

TransferTracker::TransferTracker(int64_t numHostPages, int32_t numDevicePages)
    : mHostPageLast(static_cast<size_t>(numHostPages))
    , mPageLast(static_cast<size_t>(numDevicePages))
{
}

TransferTracker::~TransferTracker() noexcept
{
    // Nothing may still read or write the tier's memory once it is unpinned or freed after this.
    for (RecordPtr const& record : mRecords)
    {
        record->event.synchronizeNoThrow();
    }
}

TransferTracker::RecordPtr TransferTracker::acquireRecord()
{
    // A record nobody but this list holds belongs to no host page, page or caller-visible lastEvent any more.
    for (size_t n = 0; n < mRecords.size(); ++n)
    {
        size_t const i = (mNextRecord + n) % mRecords.size();
        if (mRecords[i].use_count() == 1)
        {
            mNextRecord = i + 1;
            return mRecords[i];
        }
    }
    auto record = std::make_shared<Record>();
    mRecords.push_back(record);
    return record;
}

void TransferTracker::waitForOverlaps(
    HostTierEntry const* entries, int32_t count, int32_t stagingHalf, cudaStream_t stream)
{
    std::vector<Record*> waits;
    auto const consider = [&](RecordPtr& last)
    {
        if (!last || last->stream == stream)
        {
            return;
        }
        if (last->event.isComplete())
        {
            last.reset();
        }
        else if (std::find(waits.begin(), waits.end(), last.get()) == waits.end())
        {
            waits.push_back(last.get());
        }
    };
    for (int32_t i = 0; i < count; ++i)
    {
        consider(mHostPageLast[static_cast<size_t>(entries[i].hostPage)]);
        consider(mPageLast[static_cast<size_t>(entries[i].page)]);
    }
    if (stagingHalf != kNO_STAGING)
    {
        consider(mStagingLast[stagingHalf]);
    }
    for (Record const* record : waits)
    {
        KVCACHE_CUDA_TRY(cudaStreamWaitEvent(stream, record->event.get(), 0));
    }
}

void TransferTracker::record(HostTierEntry const* entries, int32_t count, int32_t stagingHalf, cudaStream_t stream)
{
    RecordPtr const record = acquireRecord();
    record->event.record(stream);
    record->stream = stream;
    for (int32_t i = 0; i < count; ++i)
    {
        mHostPageLast[static_cast<size_t>(entries[i].hostPage)] = record;
        mPageLast[static_cast<size_t>(entries[i].page)] = record;
    }
    mLast = record;
    if (stagingHalf != kNO_STAGING)
    {
        mStagingLast[stagingHalf] = record;
    }
}

bool TransferTracker::isBusy(int32_t hostPage) const
{
    RecordPtr const& last = mHostPageLast[static_cast<size_t>(hostPage)];
    return last && !last->event.isComplete();
}

void TransferTracker::synchronize(int32_t const* hostPages, int64_t count)
{
    for (int64_t i = 0; i < count; ++i)
    {
        RecordPtr& last = mHostPageLast[static_cast<size_t>(hostPages[i])];
        if (last)
        {
            last->event.synchronize();
            last.reset();
        }
    }
}

cudaEvent_t TransferTracker::lastEvent() const noexcept
{
    return mLast ? mLast->event.get() : nullptr;
}

} // namespace kvcache::rt::detail
