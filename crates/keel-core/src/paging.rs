//! Pagination helpers for tools: a tool returns one page and an opaque `next_token`; the
//! model asks for the next page by passing the token back.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Arguments a paginated tool accepts (flatten them into its argument type).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PageRequest {
    /// The `next_token` of the previous page; omit for the first page.
    #[serde(default)]
    pub page_token: Option<String>,
    /// Items per page (capped at the tool's page limit).
    #[serde(default)]
    pub page_size: Option<u32>,
}

/// One page of results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Page<T> {
    /// The items of this page.
    pub items: Vec<T>,
    /// 1-based page number.
    pub page: u32,
    /// Total items across pages, when known.
    pub total: Option<u64>,
    /// Pass this as `page_token` to get the next page; absent on the last page.
    pub next_token: Option<String>,
}

/// Why a page could not be produced.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid page_token `{0}`: pass the next_token of the previous page unchanged, or omit it for the first page"
)]
pub struct BadPageToken(pub String);

/// Cuts one page out of `items`. Tokens are opaque to the model (`o<offset>`).
pub fn paginate<T: Clone>(
    items: &[T],
    request: &PageRequest,
    page_limit: u32,
) -> Result<Page<T>, BadPageToken> {
    let offset = match &request.page_token {
        None => 0usize,
        Some(token) => token
            .strip_prefix('o')
            .and_then(|n| n.parse::<usize>().ok())
            .filter(|n| *n <= items.len())
            .ok_or_else(|| BadPageToken(token.clone()))?,
    };
    let size = request
        .page_size
        .unwrap_or(page_limit)
        .clamp(1, page_limit.max(1)) as usize;
    let end = offset.saturating_add(size).min(items.len());
    let page_items = items
        .get(offset..end)
        .map(<[T]>::to_vec)
        .unwrap_or_default();
    Ok(Page {
        page: u32::try_from(offset / size)
            .unwrap_or(u32::MAX)
            .saturating_add(1),
        total: Some(items.len() as u64),
        next_token: (end < items.len()).then(|| format!("o{end}")),
        items: page_items,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_pages() {
        let items: Vec<u32> = (0..250).collect();
        let first = paginate(&items, &PageRequest::default(), 100).unwrap();
        assert_eq!(
            (first.items.len(), first.page, first.next_token.as_deref()),
            (100, 1, Some("o100"))
        );
        let second = paginate(
            &items,
            &PageRequest {
                page_token: first.next_token,
                page_size: None,
            },
            100,
        )
        .unwrap();
        assert_eq!((second.items[0], second.page), (100, 2));
        let third = paginate(
            &items,
            &PageRequest {
                page_token: second.next_token,
                page_size: None,
            },
            100,
        )
        .unwrap();
        assert_eq!(
            (third.items.len(), third.page, third.next_token),
            (50, 3, None)
        );
        assert!(
            paginate(
                &items,
                &PageRequest {
                    page_token: Some("x".into()),
                    page_size: None
                },
                100
            )
            .is_err()
        );
    }
}
