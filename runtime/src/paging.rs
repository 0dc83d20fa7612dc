//! One page size for every paged read: keyset pages and bucket pages name
//! it `page_size` and share its default and its bound.

/// Items a page holds when neither the model nor the call names a size.
pub const DEFAULT_PAGE_SIZE: u32 = 100;

/// The most items one page holds, in every repository: a page is read
/// into memory at once. Longer reads belong to the streams
/// (`Keyset::stream`, `Buckets::stream`), which page under the hood.
pub const MAX_PAGE_SIZE: u32 = 10_000;
