"""The query side of retrieval: captured query rows, query-ahead scoring, the scoring context."""
