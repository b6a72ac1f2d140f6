"""Taking results out of the warehouse: CSV and Parquet export, the paper's figures, the HTML report. Reads
through `storing/`; never writes a model's rows."""
