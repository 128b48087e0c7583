"""The outbox table's shape: the names of its objects (:mod:`.names`) and the table mapping, which of its
columns make a record (:mod:`.protocol`, the interface; :mod:`.goharvest` and :mod:`.debezium`, the two
mappings; :mod:`.table`, the chooser; docs/design.md "Table mappings")."""

# The package loads its modules: the interface and the mappings name OutboxNames in their signatures
# (type-only imports), and names holds a mapping, so the package, not one module, is their unit.
from harvest_outbox.producer.mapping import debezium as debezium
from harvest_outbox.producer.mapping import goharvest as goharvest
from harvest_outbox.producer.mapping import names as names
from harvest_outbox.producer.mapping import protocol as protocol
from harvest_outbox.producer.mapping import table as table
