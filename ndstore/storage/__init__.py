"""Small, typed, batch-first storage interfaces and their adapters. No business logic here."""
