"""transforms: autodiff (reverse and forward mode), vmap, Jacobians."""
