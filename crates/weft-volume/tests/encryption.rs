//! Encryption at rest on a pool, end to end on in-memory devices: what the
//! devices hold, what a node with and without the key reads, rotation and
//! crypto-erase.

use std::sync::Arc;
use weft_volume::crypt::{KeyError, Keyring};
use weft_volume::testing::FaultyMedia;
use weft_volume::{Pool, PoolOptions, VolumeError, VolumeSpec};

const OLD_KEK: &str = "5f0e4d3c2b1a09f8e7d6c5b4a3928170f6e5d4c3b2a190807f6e5d4c3b2a1908";
const NEW_KEK: &str = "9a8b7c6d5e4f30211203f4e5d6c7b8a99a8b7c6d5e4f30211203f4e5d6c7b8a9";

fn keyring(keys: &[&str]) -> Arc<Keyring> {
    Arc::new(Keyring::parse(&keys.join("\n")).unwrap())
}

fn options() -> PoolOptions {
    PoolOptions {
        name: "p".into(),
        chunk_bytes: 64 << 10,
        uuid: [7; 16],
    }
}

fn spec(name: &str, encrypted: bool) -> VolumeSpec {
    VolumeSpec {
        name: name.into(),
        size_bytes: 1 << 20,
        block_size: 4096,
        thick: false,
        encrypted,
        compression: weft_volume::compression::Compression::None,
    }
}

/// A recognisable 4 KiB block: "weft secret NNNN" repeated.
fn secret(n: u32) -> Vec<u8> {
    format!("weft secret {n:04}").repeat(256).into_bytes()
}

#[test]
fn an_encrypted_volume_leaves_no_trace_and_reads_only_with_its_key() {
    let mut pool = Pool::create(FaultyMedia::new(2, 8 << 20, 1), options()).unwrap();
    pool.unlock(keyring(&[OLD_KEK]));
    pool.create_volume(&spec("secret", true)).unwrap();
    pool.create_volume(&spec("plain", false)).unwrap();
    for n in 0..8 {
        pool.write("secret", u64::from(n) * 8192, &secret(n))
            .unwrap();
    }
    pool.write("plain", 0, &secret(99)).unwrap();
    pool.create_snapshot("secret", "s").unwrap();
    pool.clone_volume("secret", "s", "copy").unwrap();
    pool.flush().unwrap();
    let media = pool.into_media().crash();
    assert!(
        media.contains(b"weft secret 0099"),
        "the control is stored in the clear"
    );
    for n in 0..8 {
        assert!(
            !media.contains(format!("secret {n:04}").as_bytes()),
            "block {n} is on the devices in the clear"
        );
    }

    // Without the key: listed, locked, named.
    let mut pool = Pool::open(media.clone()).unwrap();
    let info = pool.volume_info("secret").unwrap();
    let encryption = info.encryption.unwrap();
    assert!(!encryption.unlocked);
    let error = pool.read("secret", 0, &mut [0; 4096]).unwrap_err();
    assert!(
        matches!(
            error,
            VolumeError::Locked {
                source: KeyError::Missing { .. },
                ..
            }
        ),
        "{error}"
    );
    assert!(
        error.to_string().contains(&encryption.kek_id.to_string()),
        "{error}"
    );
    assert!(error.to_string().contains("--kek-file"), "{error}");
    let mut buf = vec![0; 4096];
    pool.read("plain", 0, &mut buf).unwrap();
    assert_eq!(buf, secret(99), "unencrypted volumes are unaffected");
    assert!(
        !pool.unlock(keyring(&[NEW_KEK])).is_empty(),
        "another KEK opens nothing"
    );
    let error = pool.create_volume(&spec("new", true));
    assert!(error.is_ok(), "a node with a KEK makes encrypted volumes");

    // With the key: everything reads back, clone and snapshot included.
    let mut pool = Pool::open(media).unwrap();
    assert!(pool.unlock(keyring(&[OLD_KEK])).is_empty());
    assert!(
        pool.volume_info("secret")
            .unwrap()
            .encryption
            .unwrap()
            .unlocked
    );
    for n in 0..8 {
        pool.read("secret", u64::from(n) * 8192, &mut buf).unwrap();
        assert_eq!(buf, secret(n));
        pool.read("copy", u64::from(n) * 8192, &mut buf).unwrap();
        assert_eq!(buf, secret(n), "the clone shares the key");
        pool.read_snapshot("secret", "s", u64::from(n) * 8192, &mut buf)
            .unwrap();
        assert_eq!(buf, secret(n));
    }
    pool.read("secret", 4096, &mut buf).unwrap();
    assert_eq!(buf, vec![0; 4096], "never-written blocks read as zeroes");
    pool.deallocate("secret", 8192, 4096).unwrap();
    pool.read("secret", 8192, &mut buf).unwrap();
    assert_eq!(buf, vec![0; 4096], "deallocated blocks read as zeroes");
}

#[test]
fn a_node_without_a_keyring_refuses_to_encrypt() {
    let mut pool = Pool::create(FaultyMedia::new(1, 8 << 20, 1), options()).unwrap();
    let error = pool.create_volume(&spec("v", true)).unwrap_err();
    assert!(matches!(error, VolumeError::NoKeyring { .. }), "{error}");
    assert!(error.to_string().contains("openssl rand -hex 32"));
    assert!(pool.volume_info("v").is_err(), "nothing was created");
}

#[test]
fn rotation_rewraps_without_rewriting_data_and_leaves_no_old_wrapping() {
    let mut pool = Pool::create(FaultyMedia::new(1, 8 << 20, 1), options()).unwrap();
    pool.unlock(keyring(&[OLD_KEK]));
    pool.create_volume(&spec("v", true)).unwrap();
    pool.write("v", 0, &secret(1)).unwrap();
    pool.flush().unwrap();
    let old_id = keyring(&[OLD_KEK]).ids()[0];
    let old_wrapping = pool.volumes().next().unwrap().key.clone().unwrap();
    assert!(pool.media().contains(&old_wrapping.0));
    let before = pool.media().clone();

    pool.unlock(keyring(&[NEW_KEK, OLD_KEK]));
    let done = pool.rewrap().unwrap();
    assert_eq!(done.rewrapped, vec!["v".to_string()]);
    assert!(
        !pool.media().contains(&old_wrapping.0),
        "the old wrapping is scrubbed"
    );
    let info = pool.volume_info("v").unwrap().encryption.unwrap();
    assert_ne!(info.kek_id, old_id);
    assert_eq!(
        pool.rewrap().unwrap().rewrapped,
        Vec::<String>::new(),
        "nothing left to do"
    );

    // Same data blocks on the devices: only the wrapping changed.
    let block = |media: &FaultyMedia| {
        let mut pool = Pool::open(media.clone()).unwrap();
        pool.unlock(keyring(&[NEW_KEK, OLD_KEK]));
        let mut buf = vec![0; 4096];
        pool.read("v", 0, &mut buf).unwrap();
        buf
    };
    assert_eq!(block(&before), secret(1));
    let media = pool.into_media().crash();
    assert_eq!(block(&media), secret(1));
    let mut pool = Pool::open(media.clone()).unwrap();
    assert!(
        pool.unlock(keyring(&[NEW_KEK])).is_empty(),
        "the old KEK is no longer needed"
    );
    let mut pool = Pool::open(media).unwrap();
    assert!(
        !pool.unlock(keyring(&[OLD_KEK])).is_empty(),
        "the old KEK alone opens nothing"
    );
}

#[test]
fn deleting_an_encrypted_volume_destroys_its_key() {
    let mut pool = Pool::create(FaultyMedia::new(2, 8 << 20, 1), options()).unwrap();
    pool.unlock(keyring(&[OLD_KEK]));
    pool.create_volume(&spec("v", true)).unwrap();
    pool.create_volume(&spec("keep", true)).unwrap();
    pool.write("v", 0, &secret(1)).unwrap();
    // Enough journal traffic that copies of the key sit in several places.
    pool.resize_volume("v", 2 << 20).unwrap();
    pool.create_snapshot("v", "s").unwrap();
    pool.delete_snapshot("v", "s").unwrap();
    let wrapped = pool
        .volumes()
        .find(|v| v.name == "v")
        .unwrap()
        .key
        .clone()
        .unwrap();
    assert!(pool.media().contains(&wrapped.0));
    pool.delete_volume("v").unwrap();
    assert!(
        !pool.media().contains(&wrapped.0),
        "a wrapped key survived the delete"
    );
    let media = pool.into_media().crash();
    assert!(!media.contains(&wrapped.0));
    let mut pool = Pool::open(media).unwrap();
    assert!(pool.unlock(keyring(&[OLD_KEK])).is_empty());
    assert!(pool.volume_info("v").is_err());
    pool.write("keep", 0, &secret(2)).unwrap();
}

/// A crash at any write of a delete's crypto-erase: the pool reopens with
/// the volume (delete not committed) or without it and without any copy
/// of its wrapped key (the scrub is finished at the open).
#[test]
fn a_crypto_erase_cut_short_by_a_crash_is_finished_at_the_next_open() {
    let mut pool = Pool::create(FaultyMedia::new(2, 8 << 20, 3), options()).unwrap();
    pool.unlock(keyring(&[OLD_KEK]));
    pool.create_volume(&spec("v", true)).unwrap();
    pool.write("v", 0, &secret(1)).unwrap();
    pool.flush().unwrap();
    let wrapped = pool.volumes().next().unwrap().key.clone().unwrap();
    let base = pool.into_media();
    let mut finished = false;
    for failing_write in 0..400 {
        let mut media = base.clone();
        media.fail_after_writes(failing_write);
        let mut pool = Pool::open(media).unwrap();
        pool.unlock(keyring(&[OLD_KEK]));
        let deleted = pool.delete_volume("v");
        let failed = pool.media().has_failed();
        let pool = Pool::open(pool.into_media().crash()).unwrap();
        let media = pool.media();
        match pool.volume_info("v") {
            Ok(_) => assert!(media.contains(&wrapped.0)),
            Err(_) => assert!(
                !media.contains(&wrapped.0),
                "write {failing_write}: the key survived a delete"
            ),
        }
        if !failed {
            deleted.unwrap();
            finished = true;
            break;
        }
    }
    assert!(finished);
}

/// A volume unlocked with a KEK the keyring no longer has stays served and
/// is rewrapped from its key in memory.
#[test]
fn a_rewrap_after_the_old_kek_is_gone_uses_the_key_in_memory() {
    let mut pool = Pool::create(FaultyMedia::new(1, 8 << 20, 1), options()).unwrap();
    pool.unlock(keyring(&[OLD_KEK]));
    pool.create_volume(&spec("v", true)).unwrap();
    pool.write("v", 0, &secret(5)).unwrap();
    assert!(
        pool.unlock(keyring(&[NEW_KEK])).is_empty(),
        "still unlocked"
    );
    let mut buf = vec![0; 4096];
    pool.read("v", 0, &mut buf).unwrap();
    assert_eq!(buf, secret(5));
    assert_eq!(pool.rewrap().unwrap().rewrapped, vec!["v".to_string()]);
    pool.flush().unwrap();
    let mut pool = Pool::open(pool.into_media().crash()).unwrap();
    assert!(pool.unlock(keyring(&[NEW_KEK])).is_empty());
    pool.read("v", 0, &mut buf).unwrap();
    assert_eq!(buf, secret(5));
    let error = pool.read("v", 512, &mut buf).unwrap_err();
    assert!(
        error.to_string().contains("whole 4096-byte blocks"),
        "{error}"
    );
}
