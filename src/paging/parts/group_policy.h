#pragma once

#include <algorithm>
#include <cstdint>

namespace kvcache::rt
{

//! How a page group of full attention keeps pages: every page of a sequence until the sequence is freed.
struct FullAttentionPolicy
{
    //! Returns the first entry a sequence still needs when its next token is at `position`: always the first.
    static constexpr int32_t firstNeeded(int64_t /*position*/) noexcept
    {
        return 0;
    }
    //! Returns whether a sequence holding `held` pages of the group is within the group's bound: always.
    static constexpr bool withinBound(int64_t /*held*/) noexcept
    {
        return true;
    }
};

//! How a page group of sliding-window attention keeps pages: only those holding one of the `window` tokens before the
//! next one; at most pagesPerSequence at once.
struct SlidingWindowPolicy
{
    int32_t window = 0;
    int32_t pagesPerSequence = 0;
    //! log2(tokensPerPage).
    int32_t pageShift = 0;

    //! Returns the first entry a sequence still needs when its next token is at `position`: earlier pages hold only
    //! tokens more than window - 1 tokens back.
    int32_t firstNeeded(int64_t position) const noexcept
    {
        int64_t const firstToken = std::max<int64_t>(0, position - window + 1);
        return static_cast<int32_t>(firstToken >> pageShift);
    }
    //! Returns whether a sequence holding `held` pages of the group is within the group's bound.
    bool withinBound(int64_t held) const noexcept
    {
        return held <= pagesPerSequence;
    }
};

//! The policy of one page group: a switch over the two kinds, so that per-page loops call no function pointer.
class GroupPolicy
{
public:
    GroupPolicy() = default;
    //! Returns the policy of a group of `slidingWindow` tokens (0: full attention).
    GroupPolicy(int32_t slidingWindow, int32_t pagesPerSequence, int32_t pageShift) noexcept
        : mWindowed(slidingWindow != 0)
        , mWindow{slidingWindow, pagesPerSequence, pageShift}
    {
    }

    //! Returns whether the group releases pages that leave its window.
    bool windowed() const noexcept
    {
        return mWindowed;
    }
    //! Calls `f` with the group's policy object (FullAttentionPolicy or SlidingWindowPolicy) and returns its result.
    template <typename F>
    decltype(auto) visit(F&& f) const
    {
        return mWindowed ? f(mWindow) : f(FullAttentionPolicy{});
    }
    //! Returns the first entry a sequence still needs when its next token is at `position`.
    int32_t firstNeeded(int64_t position) const noexcept
    {
        return mWindowed ? mWindow.firstNeeded(position) : 0;
    }
    //! Returns the first page an adopted prefix of `pages` whole pages of `tokensPerPage` tokens holds in the group:
    //! the group needs pages [firstAdopted, pages) of it.
    int32_t firstAdopted(int32_t pages, int32_t tokensPerPage) const noexcept
    {
        return firstNeeded(int64_t{pages} * tokensPerPage);
    }
    //! Returns whether a sequence holding `held` pages of the group is within the group's pagesPerSequence bound.
    bool withinBound(int64_t held) const noexcept
    {
        return !mWindowed || mWindow.withinBound(held);
    }
    //! Returns the group's pagesPerSequence bound (0 for full attention: none).
    int32_t pagesPerSequence() const noexcept
    {
        return mWindowed ? mWindow.pagesPerSequence : 0;
    }

private:
    bool mWindowed = false;
    SlidingWindowPolicy mWindow;
};

} // namespace kvcache::rt
