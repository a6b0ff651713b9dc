package mnemosyne.dev;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Map;
import java.util.concurrent.CountDownLatch;

import org.neo4j.configuration.GraphDatabaseSettings;
import org.neo4j.configuration.connectors.BoltConnector;
import org.neo4j.configuration.helpers.SocketAddress;
import org.neo4j.dbms.api.DatabaseManagementService;
import org.neo4j.dbms.api.DatabaseManagementServiceBuilder;
import org.neo4j.io.ByteUnit;

/**
 * Neo4j Community, embedded, with its Bolt connector on 127.0.0.1 only, for
 * development and tests (started and stopped by scripts/dev).
 *
 * <p>usage: Neo4jDev HOME PORT PASSWORD_FILE
 *
 * <p>Auth is on: the built-in user {@code neo4j} gets the password read from
 * PASSWORD_FILE (never from the command line). "Neo4j dev server ready" is
 * printed once Bolt answers with that password.
 */
public final class Neo4jDev {
    public static void main(String[] args) throws Exception {
        if (args.length != 3) {
            System.err.println("usage: Neo4jDev HOME PORT PASSWORD_FILE");
            System.exit(2);
        }
        Path home = Path.of(args[0]).toAbsolutePath();
        int port = Integer.parseInt(args[1]);
        String password = Files.readString(Path.of(args[2]), StandardCharsets.UTF_8).trim();

        DatabaseManagementService dbms = new DatabaseManagementServiceBuilder(home)
                .setConfig(BoltConnector.enabled, true)
                .setConfig(BoltConnector.listen_address, new SocketAddress("127.0.0.1", port))
                .setConfig(BoltConnector.encryption_level, BoltConnector.EncryptionLevel.DISABLED)
                .setConfig(GraphDatabaseSettings.auth_enabled, true)
                .setConfig(GraphDatabaseSettings.pagecache_memory, ByteUnit.mebiBytes(256))
                .build();
        CountDownLatch stopped = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            System.out.println("Neo4j dev server stopping");
            dbms.shutdown();
            stopped.countDown();
        }, "neo4j-dev-shutdown"));

        try {
            dbms.database(GraphDatabaseSettings.SYSTEM_DATABASE_NAME).executeTransactionally(
                    "ALTER USER neo4j SET PASSWORD $password CHANGE NOT REQUIRED",
                    Map.of("password", password));
        } catch (RuntimeException e) {
            // A restart over existing data: the password is already this one.
            if (!String.valueOf(e.getMessage()).contains("cannot be the same")) {
                throw e;
            }
        }
        System.out.println("Neo4j dev server ready: bolt://127.0.0.1:" + port + " (user neo4j)");
        System.out.flush();
        stopped.await();
    }
}
