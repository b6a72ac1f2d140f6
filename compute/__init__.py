"""Pure math on arrays: the exact 2n x 2n reduction of each head's form, its spectra,
the paper's per-head statistics, the random baseline and the distribution fits.
No I/O and no database here."""
